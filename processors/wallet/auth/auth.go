// Package auth is who may call the wallet's API. Two kinds of caller:
//
//   - Activity services (apps) grant rewards. Each app holds one or more
//     keys (key id and secret, from config) and signs every request with
//     HMAC-SHA256 over the method, the path, a timestamp and the body's
//     hash. Several keys per app make rotation a config change: add the new
//     key, move the app's callers to it, remove the old one.
//   - Users read their balance and flow and withdraw. They carry a signed
//     user token (a JWT, HS256, issued by the login service with a user key
//     from config) whose subject is their actID; a token for one user opens
//     nothing of another's.
//
// Secrets never live in the repository: they come from config (file, env,
// flags), and `surge wallet keygen` makes new ones.
package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Refusals. ErrUnauthenticated answers 401 (who are you?), ErrForbidden
// 403 (not you).
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrForbidden       = errors.New("forbidden")
)

// Headers of an app's signed request.
const (
	HeaderKey       = "X-Surge-Key"       // the key id
	HeaderTimestamp = "X-Surge-Timestamp" // unix seconds, within MaxSkew of the server's clock
	HeaderSignature = "X-Surge-Signature" // hex HMAC-SHA256 of StringToSign
)

// MaxSkew bounds how far a signed request's timestamp may be from the
// server's clock: a captured request cannot be replayed later than this
// (and a grant replayed within it is a duplicate of its order number).
const MaxSkew = 5 * time.Minute

// Key is one secret: an app's request key or a user-token key.
type Key struct {
	ID     string
	App    string // app keys only: the app the key belongs to
	Secret []byte
}

// minSecret is the shortest secret accepted: 128 bits.
const minSecret = 16

// ParseAppKeys reads app keys from "app:keyid:secret,app:keyid:secret";
// a secret is base64 (std or URL alphabet) of at least 16 bytes.
func ParseAppKeys(s string) ([]Key, error) {
	var keys []Key
	for _, item := range splitList(s) {
		parts := strings.SplitN(item, ":", 3)
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("app key %q: want app:keyid:secret", redact(item))
		}
		secret, err := decodeSecret(parts[2])
		if err != nil {
			return nil, fmt.Errorf("app key %s of %s: %w", parts[1], parts[0], err)
		}
		keys = append(keys, Key{ID: parts[1], App: parts[0], Secret: secret})
	}
	return keys, uniqueIDs(keys)
}

// ParseUserKeys reads user-token keys from "keyid:secret,keyid:secret";
// the first issues new tokens, all of them verify.
func ParseUserKeys(s string) ([]Key, error) {
	var keys []Key
	for _, item := range splitList(s) {
		id, enc, ok := strings.Cut(item, ":")
		if !ok || id == "" {
			return nil, fmt.Errorf("user key %q: want keyid:secret", redact(item))
		}
		secret, err := decodeSecret(enc)
		if err != nil {
			return nil, fmt.Errorf("user key %s: %w", id, err)
		}
		keys = append(keys, Key{ID: id, Secret: secret})
	}
	return keys, uniqueIDs(keys)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func uniqueIDs(keys []Key) error {
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k.ID] {
			return fmt.Errorf("key id %q given twice", k.ID)
		}
		seen[k.ID] = true
	}
	return nil
}

// redact keeps a bad config item's shape in an error, not its secret.
func redact(item string) string {
	if i := strings.LastIndexByte(item, ':'); i >= 0 {
		return item[:i+1] + "…"
	}
	return "…"
}

func decodeSecret(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			if len(b) < minSecret {
				return nil, fmt.Errorf("secret of %d bytes, want at least %d", len(b), minSecret)
			}
			return b, nil
		}
	}
	return nil, errors.New("secret is not base64")
}

// NewSecret returns a random 32-byte secret, base64: what `surge wallet
// keygen` prints.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// StringToSign is what an app's signature covers: method, path with
// query, timestamp and the body's SHA-256, one per line.
func StringToSign(method, uri, timestamp string, body []byte) string {
	h := sha256.Sum256(body)
	return method + "\n" + uri + "\n" + timestamp + "\n" + hex.EncodeToString(h[:])
}

func mac(secret []byte, msg string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// Sign sets the headers of an app's signed request (body is the request's
// body, which the caller also sends).
func Sign(req *http.Request, body []byte, k Key, now time.Time) {
	ts := strconv.FormatInt(now.Unix(), 10)
	req.Header.Set(HeaderKey, k.ID)
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, hex.EncodeToString(mac(k.Secret, StringToSign(req.Method, req.URL.RequestURI(), ts, body))))
}

// Apps verifies apps' signed requests.
type Apps struct{ byID map[string]Key }

// NewApps returns a verifier of the given app keys.
func NewApps(keys []Key) *Apps {
	a := &Apps{byID: map[string]Key{}}
	for _, k := range keys {
		a.byID[k.ID] = k
	}
	return a
}

// Len is the number of keys.
func (a *Apps) Len() int { return len(a.byID) }

// Verify returns the app that signed r (whose body is body).
func (a *Apps) Verify(r *http.Request, body []byte, now time.Time) (string, error) {
	p, err := a.Begin(r, now)
	if err != nil {
		return "", err
	}
	_, _ = p.Write(body)
	return p.Finish()
}

// Begin decides what the headers of r can decide before its body is read:
// a known key id, a timestamp within MaxSkew, a signature of the right
// shape. A request failing these is refused without reading a byte of its
// body. The body is then written to the Pending as it is read (it hashes
// it on the way, keeping nothing), and Finish checks the signature.
func (a *Apps) Begin(r *http.Request, now time.Time) (*Pending, error) {
	id, ts, sig := r.Header.Get(HeaderKey), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderSignature)
	if id == "" || ts == "" || sig == "" {
		return nil, fmt.Errorf("%w: app request not signed (want %s, %s and %s headers)", ErrUnauthenticated, HeaderKey, HeaderTimestamp, HeaderSignature)
	}
	k, ok := a.byID[id]
	if !ok {
		return nil, fmt.Errorf("%w: unknown key %q", ErrUnauthenticated, id)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: timestamp %q is not unix seconds", ErrUnauthenticated, ts)
	}
	if skew := now.Sub(time.Unix(sec, 0)); skew > MaxSkew || skew < -MaxSkew {
		return nil, fmt.Errorf("%w: timestamp %s is %s from the server's clock (at most %s)", ErrUnauthenticated, ts, skew.Round(time.Second), MaxSkew)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return nil, fmt.Errorf("%w: bad signature for key %q", ErrUnauthenticated, id)
	}
	return &Pending{key: k, ts: ts, method: r.Method, uri: r.URL.RequestURI(), sig: got, body: sha256.New()}, nil
}

// Pending is an app request whose headers passed Begin and whose body is
// being read: an io.Writer that hashes what it is given.
type Pending struct {
	key         Key
	ts          string
	method, uri string
	sig         []byte
	body        hash.Hash
}

// Write hashes the next part of the body.
func (p *Pending) Write(b []byte) (int, error) { return p.body.Write(b) }

// Finish checks the signature over the body written so far and returns
// the app that signed the request.
func (p *Pending) Finish() (string, error) {
	msg := p.method + "\n" + p.uri + "\n" + p.ts + "\n" + hex.EncodeToString(p.body.Sum(nil))
	if !hmac.Equal(p.sig, mac(p.key.Secret, msg)) {
		return "", fmt.Errorf("%w: bad signature for key %q", ErrUnauthenticated, p.key.ID)
	}
	return p.key.App, nil
}

// Users issues and verifies user tokens.
type Users struct {
	keys []Key
	byID map[string]Key
}

// NewUsers returns an issuer (with keys[0]) and verifier (with all keys).
func NewUsers(keys []Key) *Users {
	u := &Users{keys: keys, byID: map[string]Key{}}
	for _, k := range keys {
		u.byID[k.ID] = k
	}
	return u
}

// Len is the number of keys.
func (u *Users) Len() int { return len(u.keys) }

type jwtHeader struct {
	Alg string `json:"alg"`
	Typ string `json:"typ,omitempty"`
	Kid string `json:"kid"`
}

// Claims are what a user token says.
type Claims struct {
	Sub string `json:"sub"`
	Iat int64  `json:"iat"`
	Exp int64  `json:"exp"`
}

var b64 = base64.RawURLEncoding

// Issue returns a token for subject actID valid for ttl.
func (u *Users) Issue(actID string, ttl time.Duration, now time.Time) (string, error) {
	if len(u.keys) == 0 {
		return "", errors.New("auth: no user key to issue tokens with (set wallet.user_keys)")
	}
	if actID == "" || ttl <= 0 {
		return "", errors.New("auth: a token needs a subject and a positive lifetime")
	}
	k := u.keys[0]
	h, _ := json.Marshal(jwtHeader{Alg: "HS256", Typ: "JWT", Kid: k.ID})
	c, _ := json.Marshal(Claims{Sub: actID, Iat: now.Unix(), Exp: now.Add(ttl).Unix()})
	signing := b64.EncodeToString(h) + "." + b64.EncodeToString(c)
	return signing + "." + b64.EncodeToString(mac(k.Secret, signing)), nil
}

// Verify checks a token and returns its claims: the signature by a known
// key (HS256 only: "none" and other algorithms are refused), not expired.
func (u *Users) Verify(tok string, now time.Time) (Claims, error) {
	var c Claims
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return c, fmt.Errorf("%w: malformed user token", ErrUnauthenticated)
	}
	hb, err := b64.DecodeString(parts[0])
	var h jwtHeader
	if err != nil || json.Unmarshal(hb, &h) != nil {
		return c, fmt.Errorf("%w: malformed user token header", ErrUnauthenticated)
	}
	if h.Alg != "HS256" {
		return c, fmt.Errorf("%w: user token algorithm %q (want HS256)", ErrUnauthenticated, h.Alg)
	}
	k, ok := u.byID[h.Kid]
	if !ok {
		return c, fmt.Errorf("%w: user token signed by unknown key %q", ErrUnauthenticated, h.Kid)
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, mac(k.Secret, parts[0]+"."+parts[1])) {
		return c, fmt.Errorf("%w: bad user token signature", ErrUnauthenticated)
	}
	cb, err := b64.DecodeString(parts[1])
	if err != nil {
		return c, fmt.Errorf("%w: malformed user token claims", ErrUnauthenticated)
	}
	dec := json.NewDecoder(bytes.NewReader(cb))
	if err := dec.Decode(&c); err != nil || c.Sub == "" || c.Exp == 0 {
		return Claims{}, fmt.Errorf("%w: user token claims need sub and exp", ErrUnauthenticated)
	}
	if now.Unix() >= c.Exp {
		return Claims{}, fmt.Errorf("%w: user token expired at %s", ErrUnauthenticated, time.Unix(c.Exp, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// Bearer is the token of an "Authorization: Bearer ..." header, or "".
func Bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}
