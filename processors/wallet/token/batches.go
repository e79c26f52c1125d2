package token

import (
	"crypto/ed25519"
	"sync"
)

// Checking a batch token climbs from its leaf to the root: one SHA-256 per
// level, 8 levels for a batch of 256, most of a check's cost once the
// root's Ed25519 verification is shared by the batch. The ledger and the
// readers meet a batch's tokens close together, so a Keyring keeps the
// tree nodes it has proven for the batches it verified lately: a token then
// climbs only until it meets a proven node, usually after one or two
// hashes, and compares the rest of its proof with proven nodes.
//
// Every node kept is proven: it lies on a path that hashed up to a root
// whose signature verified. The kept nodes of a batch stay closed under
// "sibling" and "parent" (a climb keeps each node it computed with the
// sibling it was combined with, and it stops at a kept node), so every
// sibling a token's proof names above the node it met is kept, and a
// token whose proof differs there in any hash is refused.

// batchID is a verified batch: the root signature and the key it verified
// with. A signature binds one root, so one tree.
type batchID struct {
	pub [ed25519.PublicKeySize]byte
	sig [ed25519.SignatureSize]byte
}

// provenBatch is one batch's proven nodes, in a flat array: level 0 (the
// leaves) first, the root last.
type provenBatch struct {
	mu     sync.Mutex
	depth  int              // levels below the root
	nodes  [][hashSize]byte // by slot
	proven []uint64         // bit per slot
}

func newProvenBatch(depth int) *provenBatch {
	slots := 1<<(depth+1) - 1
	return &provenBatch{depth: depth, nodes: make([][hashSize]byte, slots), proven: make([]uint64, (slots+63)/64)}
}

// slot is where the node at index at of a level is kept: the levels below
// it hold 2^(depth+1) - 2^(depth-level+1) nodes.
func (b *provenBatch) slot(level int, at uint32) int {
	return 1<<(b.depth+1) - 1<<(b.depth-level+1) + int(at)
}

func (b *provenBatch) get(level int, at uint32) (*[hashSize]byte, bool) {
	i := b.slot(level, at)
	return &b.nodes[i], b.proven[i/64]&(1<<(i%64)) != 0
}

func (b *provenBatch) set(level int, at uint32, h [hashSize]byte) {
	i := b.slot(level, at)
	b.nodes[i] = h
	b.proven[i/64] |= 1 << (i % 64)
}

// step is one level of a climb: the node reached and the sibling that
// combines with it.
type step struct {
	at       uint32
	h, other [hashSize]byte
}

// check reports whether the token with this leaf, index and proof belongs
// to the batch, climbing until it meets a proven node; what it proves on
// the way is kept.
func (b *provenBatch) check(leaf [hashSize]byte, index uint32, proof []byte) bool {
	depth := len(proof) / hashSize
	if depth != b.depth {
		return false
	}
	var climbed [32]step
	h, at := leaf, index
	b.mu.Lock()
	defer b.mu.Unlock()
	for level := 0; ; level++ {
		if known, ok := b.get(level, at); ok {
			if *known != h {
				return false
			}
			// Met a proven node: the rest of the proof must be the
			// proven siblings above it.
			for l, a := level, at; l < depth; l, a = l+1, a/2 {
				sib, ok := b.get(l, a^1)
				if !ok || string(sib[:]) != string(proof[l*hashSize:(l+1)*hashSize]) {
					return false
				}
			}
			b.keep(climbed[:level])
			return true
		}
		if level == depth {
			return false // the root is always proven: this one differs
		}
		climbed[level], h = up(h, at, proof[level*hashSize:])
		at /= 2
	}
}

// keep records the nodes of a climb that is proven, and their siblings.
func (b *provenBatch) keep(climbed []step) {
	for level, s := range climbed {
		b.set(level, s.at, s.h)
		b.set(level, s.at^1, s.other)
	}
}

// up is one step of a climb: node h at index at meets its sibling, the
// proof's next hash; it returns the step and their parent.
func up(h [hashSize]byte, at uint32, proof []byte) (step, [hashSize]byte) {
	s := step{at: at, h: h}
	copy(s.other[:], proof[:hashSize])
	return s, parent(h, s.other, at)
}

// parent combines a node at index at with its sibling.
func parent(h, sibling [hashSize]byte, at uint32) [hashSize]byte {
	if at%2 == 0 {
		return nodeHash(h[:], sibling[:])
	}
	return nodeHash(sibling[:], h[:])
}

// provenBatches holds the provenBatch of the batches verified lately.
// Bounded; it simply starts over when full (a batch met again after that
// pays one more climb to its root, whose signature the root cache still
// remembers).
type provenBatches struct {
	mu      sync.RWMutex
	max     int
	batches map[batchID]*provenBatch
}

// maxProvenBatches bounds the batches whose nodes are kept: up to 511
// nodes each, 16 KiB, so at most 16 MiB. The tokens of a batch
// reach the ledger within moments of each other.
const maxProvenBatches = 1024

func newProvenBatches(max int) *provenBatches {
	return &provenBatches{max: max, batches: make(map[batchID]*provenBatch)}
}

func (p *provenBatches) get(id batchID) *provenBatch {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.batches[id]
}

// maxProvenDepth bounds the trees whose nodes are kept (a batch of 256 is
// 8 levels deep): a deeper tree, which no intake signs, is checked by
// climbing to its root every time rather than sized in memory.
const maxProvenDepth = 10

// add records a batch whose root signature verified, with the climb that
// reached the root (one step per level); a batch recorded meanwhile keeps
// its nodes.
func (p *provenBatches) add(id batchID, climbed []step, root [hashSize]byte) {
	depth := len(climbed)
	if depth > maxProvenDepth {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.batches[id]
	if !ok {
		if len(p.batches) >= p.max {
			clear(p.batches)
		}
		b = newProvenBatch(depth)
		p.batches[id] = b
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.depth != depth {
		return // cannot happen for a verified root; never mix two trees
	}
	b.set(depth, 0, root)
	b.keep(climbed)
}

// climb hashes from a leaf to its root, returning the root and each step.
func climb(leaf [hashSize]byte, index uint32, proof []byte, steps []step) ([hashSize]byte, []step) {
	h, at := leaf, index
	for p := proof; len(p) > 0; p, at = p[hashSize:], at/2 {
		var s step
		s, h = up(h, at, p)
		steps = append(steps, s)
	}
	return h, steps
}
