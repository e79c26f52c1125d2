package streams

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A transactional topic's last offset is a commit marker: read to end-2,
// a partition is caught up. Without Transactional the same read is not
// (a data record may still be on its way).
func TestCatchUpTransactional(t *testing.T) {
	plain := NewCatchUp(map[int32]int64{0: 10})
	plain.Saw(&kgo.Record{Partition: 0, Offset: 8})
	if plain.Done() {
		t.Fatal("plain topic caught up at end-2")
	}
	txn := NewCatchUp(map[int32]int64{0: 10, 1: 5}).Transactional()
	txn.Saw(transactional(0, 7))
	if txn.Done() {
		t.Fatal("caught up at end-3")
	}
	// A record written outside a transaction may be followed by another.
	txn.Saw(&kgo.Record{Partition: 0, Offset: 8})
	if txn.Done() {
		t.Fatal("caught up at end-2 after a non-transactional record")
	}
	txn.Saw(transactional(0, 8))
	txn.From(1, 4) // nothing but the marker left to read
	if !txn.Done() {
		t.Fatalf("not caught up: %v", txn.ends)
	}
}

// transactional is a record as read from a transaction.
func transactional(p int32, offset int64) *kgo.Record {
	return &kgo.Record{Partition: p, Offset: offset, Attrs: kgo.NewRecordAttrs(kgo.RecordAttrsOpts{Transactional: true})}
}
