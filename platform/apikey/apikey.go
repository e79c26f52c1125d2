// Package apikey authenticates service-to-service HTTP calls with bearer
// keys: each caller (a registration service, an activity service) holds a
// named secret from configuration; several secrets may be valid at once so
// a key is rotated by adding the new one, moving callers, and removing the
// old. Keys never live in the repository.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"surge/streams/httperr"
)

// Keys are the valid secrets by caller name.
type Keys struct {
	byHash map[[32]byte]string // sha256(secret) -> caller
}

// minSecret is the shortest secret accepted: 128 bits of hex.
const minSecret = 32

// Parse reads "name:secret,name:secret" (whitespace ignored). It refuses
// short secrets and duplicate names, and an empty spec.
func Parse(spec string) (*Keys, error) {
	k := &Keys{byHash: map[[32]byte]string{}}
	names := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, secret, ok := strings.Cut(part, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("api key %q: want name:secret", redact(part))
		}
		if len(secret) < minSecret {
			return nil, fmt.Errorf("api key %q: the secret must be at least %d characters (generate one with `openssl rand -hex 32`)", name, minSecret)
		}
		if names[name] {
			return nil, fmt.Errorf("api key %q given twice", name)
		}
		names[name] = true
		k.byHash[sha256.Sum256([]byte(secret))] = name
	}
	if len(k.byHash) == 0 {
		return nil, fmt.Errorf("no api keys")
	}
	return k, nil
}

func redact(s string) string {
	if name, _, ok := strings.Cut(s, ":"); ok {
		return name + ":…"
	}
	return "…"
}

// Generate returns one random key named name, for a development start
// without configured keys; the caller prints the secret once.
func Generate(name string) (*Keys, string) {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	secret := hex.EncodeToString(b)
	k, _ := Parse(name + ":" + secret)
	return k, secret
}

// Caller answers which caller a secret belongs to. Comparing hashes keeps
// the time independent of how much of a wrong secret matches.
func (k *Keys) Caller(secret string) (string, bool) {
	h := sha256.Sum256([]byte(secret))
	for kh, name := range k.byHash {
		if subtle.ConstantTimeCompare(kh[:], h[:]) == 1 {
			return name, true
		}
	}
	return "", false
}

type callerKey struct{}

// CallerOf is the authenticated caller of a request that passed Require.
func CallerOf(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}

// Bearer is the credential of an Authorization header value of the
// Bearer scheme, whose name is case-insensitive (RFC 9110, 11.1).
func Bearer(header string) (string, bool) {
	if len(header) < 7 || !strings.EqualFold(header[:7], "bearer ") {
		return "", false
	}
	return header[7:], true
}

// Require answers 401 to a request without a valid "Authorization: Bearer
// <secret>" and passes the rest to next with the caller in the context.
func (k *Keys) Require(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := Bearer(r.Header.Get("Authorization"))
		if !ok || secret == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="surge"`)
			httperr.Write(w, http.StatusUnauthorized, httperr.Unauthorized, "missing bearer key")
			return
		}
		name, ok := k.Caller(secret)
		if !ok {
			httperr.Write(w, http.StatusUnauthorized, httperr.Unauthorized, "unknown key")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, name)))
	})
}
