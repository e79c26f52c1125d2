// Package token signs and verifies the wallet's tokens: the proof of a cash
// grant the user sees before it is booked. Ed25519 over the token's fields
// (status and signature excluded, so a token keeps its signature when it
// moves from PROCESSING to SUCCESS). Keys are generated or configured, never
// in the repository; a key id names which key signed.
//
// Intake signs in batches (SignBatch): one Ed25519 signature over the root
// of a Merkle tree of up to BatchSize tokens, each token carrying its leaf
// index and the sibling hashes up to the root. Checking a token is then a
// few SHA-256 hashes plus one Ed25519 verification per batch root, which a
// Keyring remembers. One Ed25519 signature per token capped intake at the
// signing rate (about 27k/s per core) and booking at the verification rate
// (about 12k/s per core); see bench/wallet-notes.md. Tokens signed alone
// (Sign, no proof) still verify.
package token

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"

	pb "surge/schemas/surgev1"
	"surge/schemas/wire"
)

// ErrForged is a token whose signature does not verify.
var ErrForged = errors.New("token: signature does not verify")

// Keyring holds the signing key and the public keys tokens are checked with.
type Keyring struct {
	mu     sync.RWMutex
	signID string
	signer ed25519.PrivateKey
	public map[string]ed25519.PublicKey
	roots  *checkedSet    // batch roots verified
	proven *provenBatches // their proven tree nodes, for the batches met lately
}

func newKeyring(signID string, signer ed25519.PrivateKey, public map[string]ed25519.PublicKey) *Keyring {
	return &Keyring{signID: signID, signer: signer, public: public, roots: newCheckedSet(maxRoots), proven: newProvenBatches(maxProvenBatches)}
}

// Generate returns a keyring with a fresh signing key named id.
func Generate(id string) (*Keyring, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return newKeyring(id, priv, map[string]ed25519.PublicKey{id: pub}), nil
}

// FromSeed builds a keyring from a base64 32-byte seed (configuration):
// standard or URL-safe base64, padded or not (`surge wallet keygen`
// prints URL-safe without padding).
func FromSeed(id, seedB64 string) (*Keyring, error) {
	var seed []byte
	var err error
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if seed, err = enc.DecodeString(seedB64); err == nil {
			break
		}
	}
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("token: key %s: want a base64 %d-byte seed (surge wallet keygen prints one)", id, ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	return newKeyring(id, priv, map[string]ed25519.PublicKey{id: priv.Public().(ed25519.PublicKey)}), nil
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

// signed is the byte string a signature (or a batch leaf) covers: every
// field but status and the signature fields. TestSignedCoversEveryField
// fails when a new Token field is in neither set.
func signed(t *pb.Token) []byte { return appendSigned(nil, t) }

// appendSigned appends the signed byte string: the deterministic protobuf
// encoding of those fields, written out by hand because every booking
// hashes it (TestAppendSignedIsTheProtobufEncoding keeps the two equal).
func appendSigned(b []byte, t *pb.Token) []byte { return appendFields(b, t, false) }

// Marshal is the token's deterministic protobuf encoding without its
// grant, written out by hand: the ledger encodes every token it books
// again, with status SUCCESS, for the users' Redis hashes, and
// proto.Marshal was half of that work (TestMarshalIsTheProtobufEncoding
// keeps the two equal). The grant is left out: Redis keeps the token
// alone; a record on wallet.tokens adds it (MarshalWithGrant).
func Marshal(t *pb.Token) []byte {
	return appendFields(make([]byte, 0, marshalledSize(t)), t, true)
}

// marshalledSize is room enough for Marshal(t).
func marshalledSize(t *pb.Token) int {
	return 48 + len(t.AppId) + len(t.ActId) + len(t.ActivityId) + len(t.SceneId) + len(t.OutTradeNo) + len(t.RainId) +
		len(t.KeyId) + len(t.Signature) + len(t.BatchProof)
}

// grantField is the number of Token.grant in wallet.proto.
const grantField = 14

// MarshalWithGrant is the value of a cash grant's record on wallet.tokens:
// the token (Marshal) followed by its grant g as field 14, which is the
// protobuf encoding of the token with its grant set. Its first n bytes
// are Marshal(t), what the user's Redis hash keeps: intake encodes each
// token once, into one buffer, for both. The grant is written by hand too
// (appendGrant): proto.Size and proto.Marshal of it were 7% of the wallet
// process's CPU per grant.
func MarshalWithGrant(t *pb.Token, g *pb.RewardGrant) (value []byte, n int) {
	b := make([]byte, 0, marshalledSize(t)+grantRoom(g))
	b = appendFields(b, t, true)
	n = len(b)
	// The grant goes after its tag and length, which are known only once
	// it is written: write it, then move it up by the header's size.
	// Even an empty grant is written: a message field is present once set.
	b = appendGrant(b, g)
	size := len(b) - n
	var hdr [1 + binary.MaxVarintLen64]byte
	h := protowire.AppendVarint(protowire.AppendTag(hdr[:0], grantField, protowire.BytesType), uint64(size))
	b = append(b, h...)
	copy(b[n+len(h):], b[n:n+size])
	copy(b[n:], h)
	return b, n
}

// GrantOf finds the encoded grant (field 14) in a record of wallet.tokens,
// for a reader that wants the grant and not the token (sink-cash-grants);
// found is false for a token without one (an earlier build's). Were the
// field there twice, protobuf would merge the two, which is decoding
// their encodings one after the other: so they are joined.
func GrantOf(value []byte) (grant []byte, found bool, err error) {
	for b := value; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil, false, protowire.ParseError(n)
		}
		if num == grantField && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			grant, found = append(grant[:len(grant):len(grant)], v...), true
		}
		b = b[n:]
	}
	return grant, found, nil
}

// appendGrant appends g's deterministic protobuf encoding
// (TestMarshalIsTheProtobufEncoding holds it, inside a token's record, to
// proto.Marshal's for every field alone).
func appendGrant(b []byte, g *pb.RewardGrant) []byte {
	b = wire.String(b, 1, g.OrderNo)
	b = wire.String(b, 2, g.ActId)
	b = wire.String(b, 3, g.ActivityId)
	b = wire.String(b, 4, g.SceneId)
	b = wire.String(b, 5, g.RainId)
	b = wire.Varint(b, 6, uint64(int64(g.AwardType)))
	b = wire.Varint(b, 7, uint64(g.Stage))
	b = wire.Varint(b, 8, uint64(g.Amount))
	b = wire.String(b, 9, g.AppId)
	b = wire.Varint(b, 10, uint64(g.AtMs))
	b = wire.String(b, 11, g.TemplateId)
	if g.Shadow {
		b = wire.Varint(b, 12, 1)
	}
	return wire.String(b, 13, g.ParentActivityId)
}

// grantRoom is room enough for g's encoding with its tag and length.
func grantRoom(g *pb.RewardGrant) int {
	return 64 + len(g.OrderNo) + len(g.ActId) + len(g.ActivityId) + len(g.SceneId) + len(g.RainId) + len(g.AppId) +
		len(g.TemplateId) + len(g.ParentActivityId)
}

// appendFields writes the signed fields, or with all every field. Field
// numbers are wallet.proto's.
func appendFields(b []byte, t *pb.Token, all bool) []byte {
	b = wire.String(b, 1, t.AppId)
	b = wire.String(b, 2, t.ActId)
	b = wire.String(b, 3, t.ActivityId)
	b = wire.String(b, 4, t.SceneId)
	b = wire.Varint(b, 5, uint64(t.Amount))
	b = wire.String(b, 6, t.OutTradeNo)
	b = wire.Varint(b, 7, uint64(t.OpenTime))
	b = wire.String(b, 8, t.RainId)
	if all {
		b = wire.Varint(b, 9, uint64(int64(t.Status)))
	}
	b = wire.String(b, 10, t.KeyId)
	if all {
		b = wire.Bytes(b, 11, t.Signature)
		b = wire.Varint(b, 12, uint64(t.BatchIndex))
		b = wire.Bytes(b, 13, t.BatchProof)
	}
	return b
}

// Sign sets the token's key id and signature.
func (k *Keyring) Sign(t *pb.Token) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	t.KeyId = k.signID
	t.Signature = ed25519.Sign(k.signer, signed(t))
}

// BatchSize is the most tokens one batch signature covers: a tree of 256
// leaves, so a token carries 8 sibling hashes (256 bytes). An intake batch
// (wallet.batch_size, 1024 by default) is up to four signatures, and the
// ledger pays one Ed25519 check per signature. At 64 the checks
// were 11% of booking's CPU; the two extra hashes per token cost about a
// tenth of what that saved (bench/wallet-notes.md).
const BatchSize = 256

const hashSize = sha256.Size

// rootContext separates a batch root's signature from a single token's.
var rootContext = []byte("surge.wallet.token-batch.v2\x00")

func leafHash(t *pb.Token) [hashSize]byte {
	var buf [256]byte
	return sha256.Sum256(appendSigned(append(buf[:0], 0), t))
}

func nodeHash(l, r []byte) [hashSize]byte {
	var b [1 + 2*hashSize]byte
	b[0] = 1
	copy(b[1:], l)
	copy(b[1+hashSize:], r)
	return sha256.Sum256(b[:])
}

// SignBatch signs toks with one signature per BatchSize tokens: it sets
// each token's key id, the root's signature, its leaf index and its proof.
func (k *Keyring) SignBatch(toks []*pb.Token) {
	k.mu.RLock()
	id, signer := k.signID, k.signer
	k.mu.RUnlock()
	for start := 0; start < len(toks); start += BatchSize {
		group := toks[start:min(start+BatchSize, len(toks))]
		// Leaves padded with zero hashes to a power of two, at least two,
		// so every batch token has a proof.
		width := max(2, 1<<bits.Len(uint(len(group)-1)))
		levels := [][][hashSize]byte{make([][hashSize]byte, width)}
		for i, t := range group {
			t.KeyId = id
			levels[0][i] = leafHash(t)
		}
		for w := width; w > 1; w /= 2 {
			below, up := levels[len(levels)-1], make([][hashSize]byte, w/2)
			for i := range up {
				up[i] = nodeHash(below[2*i][:], below[2*i+1][:])
			}
			levels = append(levels, up)
		}
		root := levels[len(levels)-1][0]
		sig := ed25519.Sign(signer, rootMessage(root))
		// One allocation for the group's proofs: the tokens of a batch are
		// encoded and dropped together.
		size := (len(levels) - 1) * hashSize
		proofs := make([]byte, 0, len(group)*size)
		for i, t := range group {
			start := len(proofs)
			for d, at := 0, i; d < len(levels)-1; d, at = d+1, at/2 {
				sib := levels[d][at^1]
				proofs = append(proofs, sib[:]...)
			}
			t.Signature, t.BatchIndex, t.BatchProof = sig, uint32(i), proofs[start:len(proofs):len(proofs)]
		}
	}
}

// proofShapeOK reports whether t's proof is whole hashes, at most 32
// levels, and its index fits the tree they describe.
func proofShapeOK(t *pb.Token) bool {
	return len(t.BatchProof)%hashSize == 0 && len(t.BatchProof) <= 32*hashSize && t.BatchIndex>>(len(t.BatchProof)/hashSize) == 0
}

// checkedSet remembers keys of checks that passed. Bounded; it simply
// starts over when full. It serves both the batch roots a Keyring verified
// and the tokens a Verified cache checked.
type checkedSet struct {
	mu      sync.RWMutex
	max     int
	ok      map[string]struct{}
	running map[string]*runningCheck // checks under way (check)
}

// runningCheck is one check other callers of the same key wait for.
type runningCheck struct {
	done chan struct{}
	ok   bool
}

func newCheckedSet(max int) *checkedSet {
	return &checkedSet{max: max, ok: make(map[string]struct{}), running: make(map[string]*runningCheck)}
}

// check reports whether key passes, running pass at most once at a time
// per key: the tokens of one batch root reach the ledger's verifying
// goroutines together, and each used to pay the Ed25519 verification.
func (c *checkedSet) check(key string, pass func() bool) bool {
	if c.has(key) {
		return true
	}
	c.mu.Lock()
	if _, ok := c.ok[key]; ok {
		c.mu.Unlock()
		return true
	}
	if r, ok := c.running[key]; ok {
		c.mu.Unlock()
		<-r.done
		return r.ok
	}
	r := &runningCheck{done: make(chan struct{})}
	c.running[key] = r
	c.mu.Unlock()
	r.ok = pass()
	c.mu.Lock()
	delete(c.running, key)
	if r.ok {
		c.addLocked(key)
	}
	c.mu.Unlock()
	close(r.done)
	return r.ok
}

func (c *checkedSet) has(key string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.ok[key]
	return ok
}

func (c *checkedSet) add(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(key)
}

func (c *checkedSet) addLocked(key string) {
	if len(c.ok) >= c.max {
		clear(c.ok)
	}
	c.ok[key] = struct{}{}
}

// maxRoots bounds a Keyring's verified batch roots (keyed by public key,
// root and signature).
const maxRoots = 1 << 18

// rootMessage is what a batch signature signs.
func rootMessage(root [hashSize]byte) []byte {
	return append(append([]byte(nil), rootContext...), root[:]...)
}

// Verified remembers tokens whose signature was checked, so a user who
// reloads the balance page does not pay ten Ed25519 verifications again.
// The key is the whole signed byte string plus the signature: any change to
// a token misses the cache. It is bounded and simply starts over when full.
type Verified struct{ set *checkedSet }

// NewVerified returns a cache of up to max tokens.
func NewVerified(max int) *Verified { return &Verified{set: newCheckedSet(max)} }

// Verify checks t, from the cache when it was verified before.
func (v *Verified) Verify(k *Keyring, t *pb.Token) error {
	key := string(signed(t)) + t.KeyId + string(t.Signature) + string(t.BatchProof) + strconv.FormatUint(uint64(t.BatchIndex), 10)
	if v.set.has(key) {
		return nil
	}
	if err := k.Verify(t); err != nil {
		return err
	}
	v.set.add(key)
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
	if len(t.BatchProof) == 0 {
		if !ed25519.Verify(pub, signed(t), t.Signature) {
			return ErrForged
		}
		return nil
	}
	if !proofShapeOK(t) || len(t.Signature) != ed25519.SignatureSize {
		return fmt.Errorf("%w: malformed batch proof", ErrForged)
	}
	var id batchID
	copy(id.pub[:], pub)
	copy(id.sig[:], t.Signature)
	leaf := leafHash(t)
	if b := k.proven.get(id); b != nil {
		if !b.check(leaf, t.BatchIndex, t.BatchProof) {
			return ErrForged
		}
		return nil
	}
	var buf [32]step
	r, climbed := climb(leaf, t.BatchIndex, t.BatchProof, buf[:0])
	key := string(pub) + string(r[:]) + string(t.Signature) // the key itself: a re-trusted id is checked again
	if !k.roots.check(key, func() bool { return ed25519.Verify(pub, rootMessage(r), t.Signature) }) {
		return ErrForged
	}
	k.proven.add(id, climbed, r)
	return nil
}

// ExportSeedForTest returns the signing key's seed in base64, for a test
// that starts a second process with the same key.
func ExportSeedForTest(k *Keyring) string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return base64.StdEncoding.EncodeToString(k.signer.Seed())
}
