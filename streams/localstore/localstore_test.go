package localstore_test

import (
	"encoding/binary"
	"io"
	"log/slog"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"surge/streams/localstore"
)

// TestBlockCacheServesLookups guards the store options: Pebble reserves
// memtable memory out of the block cache, and with the defaults the cache
// held nothing, so every lookup read filter and index blocks from disk.
// Lookups of absent keys (the common case: a new uin, a new order number)
// must be answered from cached filter blocks.
func TestBlockCacheServesLookups(t *testing.T) {
	db, err := localstore.Open(t.TempDir(), true, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := db.NewBatch()
	for i := range 1_000_000 {
		_ = b.Set(binary.BigEndian.AppendUint64([]byte{'k'}, uint64(2*i)), make([]byte, 40), nil)
		if b.Count() >= 50_000 {
			if err := b.Commit(pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			b = db.NewBatch()
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range 200_000 {
		if _, c, err := db.Get(binary.BigEndian.AppendUint64([]byte{'k'}, uint64(2*i+1))); err == nil {
			c.Close()
			t.Fatalf("key %d should be absent", 2*i+1)
		}
	}
	m := db.Metrics().BlockCache
	if m.Hits < 10*m.Misses {
		t.Fatalf("block cache: %d hits, %d misses; lookups are going to disk", m.Hits, m.Misses)
	}
}
