// Package token signs and verifies the wallet's tokens: the proof of a cash
// grant the user sees before it is booked. Ed25519 over the token's fields
// (status and signature excluded, so a token keeps its signature when it
// moves from PROCESSING to SUCCESS). Keys are generated or configured, never
// in the repository; a key id names which key signed.
package token

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	pb "surge/schemas/surgev1"
)

// ErrForged is a token whose signature does not verify.
var ErrForged = errors.New("token: signature does not verify")

// Keyring holds the signing key and the public keys tokens are checked with.
type Keyring struct {
	mu     sync.RWMutex
	signID string
	signer ed25519.PrivateKey
	public map[string]ed25519.PublicKey
}

// Generate returns a keyring with a fresh signing key named id.
func Generate(id string) (*Keyring, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return &Keyring{signID: id, signer: priv, public: map[string]ed25519.PublicKey{id: pub}}, nil
}

// FromSeed builds a keyring from a base64 32-byte seed (configuration).
func FromSeed(id, seedB64 string) (*Keyring, error) {
	seed, err := base64.StdEncoding.DecodeString(seedB64)
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("token: key %s: want a base64 %d-byte seed", id, ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	return &Keyring{signID: id, signer: priv, public: map[string]ed25519.PublicKey{id: priv.Public().(ed25519.PublicKey)}}, nil
}

// Trust adds a public key (an older or another instance's key).
func (k *Keyring) Trust(id string, pub ed25519.PublicKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.public[id] = pub
}

// Public returns the signing key's id and public key.
func (k *Keyring) Public() (string, ed25519.PublicKey) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.signID, k.public[k.signID]
}

// signed is the byte string a signature covers.
func signed(t *pb.Token) []byte {
	c := proto.Clone(t).(*pb.Token)
	c.Status, c.Signature = 0, nil
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	return b
}

// Sign sets the token's key id and signature.
func (k *Keyring) Sign(t *pb.Token) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	t.KeyId = k.signID
	t.Signature = ed25519.Sign(k.signer, signed(t))
}

// Verified remembers tokens whose signature was checked, so a user who
// reloads the balance page does not pay ten Ed25519 verifications again.
// The key is the whole signed byte string plus the signature: any change to
// a token misses the cache. It is bounded and simply starts over when full.
type Verified struct {
	mu  sync.Mutex
	max int
	ok  map[string]struct{}
}

// NewVerified returns a cache of up to max tokens.
func NewVerified(max int) *Verified { return &Verified{max: max, ok: make(map[string]struct{}, max)} }

// Verify checks t, from the cache when it was verified before.
func (v *Verified) Verify(k *Keyring, t *pb.Token) error {
	key := string(signed(t)) + t.KeyId + string(t.Signature)
	v.mu.Lock()
	_, hit := v.ok[key]
	v.mu.Unlock()
	if hit {
		return nil
	}
	if err := k.Verify(t); err != nil {
		return err
	}
	v.mu.Lock()
	if len(v.ok) >= v.max {
		clear(v.ok)
	}
	v.ok[key] = struct{}{}
	v.mu.Unlock()
	return nil
}

// Verify checks the signature.
func (k *Keyring) Verify(t *pb.Token) error {
	k.mu.RLock()
	pub, ok := k.public[t.KeyId]
	k.mu.RUnlock()
	if !ok {
		return fmt.Errorf("%w: unknown key %q", ErrForged, t.KeyId)
	}
	if !ed25519.Verify(pub, signed(t), t.Signature) {
		return ErrForged
	}
	return nil
}

// ExportSeedForTest returns the signing key's seed in base64, for a test
// that starts a second process with the same key.
func ExportSeedForTest(k *Keyring) string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return base64.StdEncoding.EncodeToString(k.signer.Seed())
}
