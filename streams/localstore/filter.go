package localstore

import (
	"hash/maphash"
	"math/bits"
	"sync/atomic"
)

// KeyFilter is an in-memory Bloom filter of the keys a store may hold: a
// "no" is certain, a "maybe" must ask the store. Processors mostly look up
// keys they have never seen (a new order number, a new account), and a
// Pebble lookup of an absent key still builds an iterator over every
// memtable and level before the sstable filters answer; the ledger spent a
// fifth of its CPU there (bench/wallet-notes.md).
//
// Keys are only ever added. A key deleted from the store (a partition
// handed to another instance) stays a "maybe", which costs one lookup and
// is never wrong. Once more keys were added than the filter was sized for,
// more answers are "maybe"; the answers stay correct.
//
// Add and MayContain are safe for concurrent use: the processing goroutine
// adds while readers ask.
type KeyFilter struct {
	words  []atomic.Uint64
	blocks uint64 // number of 512-bit blocks (a power of two)
	seed   maphash.Seed
}

// A key's bits all lie in one 512-bit block, one bit in each of its eight
// words: one cache miss per Add or MayContain instead of one per bit (a
// split-block Bloom filter). At 10 bits per key about 1% of absent keys
// are answered "maybe".
const blockWords = 8

// blockSalts spread the hash's high half over the eight words' bits.
var blockSalts = [blockWords]uint32{0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31}

// NewKeyFilter returns a filter sized for about keys keys at 10 bits each
// (rounded up to a power of two; 10M keys take 16 MiB).
func NewKeyFilter(keys int) *KeyFilter {
	n := uint64(max(keys, 1024)) * 10
	blocks := uint64(1) << bits.Len64((n+511)/512-1)
	return &KeyFilter{words: make([]atomic.Uint64, blocks*blockWords), blocks: blocks, seed: maphash.MakeSeed()}
}

// locate returns the key's block and, per word, the bit to test.
func (f *KeyFilter) locate(key []byte) ([]atomic.Uint64, [blockWords]uint64) {
	h := maphash.Bytes(f.seed, key)
	b := (h & (f.blocks - 1)) * blockWords
	var masks [blockWords]uint64
	for i, salt := range blockSalts {
		masks[i] = 1 << ((uint32(h>>32) * salt) >> 26)
	}
	return f.words[b : b+blockWords], masks
}

// Add records that the store may hold key. Call it before the key can be
// read from the store, so a "no" is never stale.
func (f *KeyFilter) Add(key []byte) {
	block, masks := f.locate(key)
	for i, m := range masks {
		if block[i].Load()&m == 0 {
			block[i].Or(m)
		}
	}
}

// MayContain reports whether the store may hold key; false is certain.
func (f *KeyFilter) MayContain(key []byte) bool {
	block, masks := f.locate(key)
	for i, m := range masks {
		if block[i].Load()&m == 0 {
			return false
		}
	}
	return true
}
