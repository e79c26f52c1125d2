package pool

import (
	"encoding/binary"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Anyone who may write uin.pool can put anything there; the rebuild folds
// it. Whatever the records (arbitrary bytes, changes in any order, keyed
// by the wrong bucket), the fold never panics and never holds a uin both
// handed out and available, or released without being available; a
// change keyed by another bucket changes nothing; and a uin handed out
// (ALLOCATE) is not available again until a RELEASE or GIVEN_BACK of it.
func FuzzFoldRecords(f *testing.F) {
	f.Add([]byte{}, []byte{1, 0, 0, 0, 7, 1, 2, 0, 0, 0, 7, 1, 3, 0, 0, 0, 7, 1}, uint8(4))
	f.Add([]byte("\x08\x01\x10\x07"), []byte{2, 0, 0, 0, 5, 0, 1, 0, 0, 0, 5, 1}, uint8(1))
	f.Add([]byte("\xff\xfe garbage"), []byte{5, 0xff, 0xff, 0xff, 0xff, 1}, uint8(0))
	f.Fuzz(func(t *testing.T, raw, ops []byte, buckets uint8) {
		n := int(buckets%8) + 1
		fold := NewFold(n)
		check := func(what string) {
			t.Helper()
			if both := roaring.And(fold.Used, fold.Pooled); !both.IsEmpty() {
				t.Fatalf("%s: uins both handed out and available: %v", what, both.ToArray())
			}
			if !roaring.AndNot(fold.Released, fold.Pooled).IsEmpty() {
				t.Fatalf("%s: released uins not available", what)
			}
		}
		// Arbitrary bytes as a record on uin.pool: decoded or refused.
		var c pb.PoolChange
		if streams.Decode(&kgo.Record{Value: raw}, &c) == nil {
			for _, key := range [][]byte{nil, raw, BucketKey(uint32(c.Uin) % uint32(n))} {
				fold.Apply(key, &c)
				check("a raw record")
			}
		}
		// A sequence of changes: op, uin (big-endian, few distinct so they
		// collide), keyed by its bucket or not.
		for len(ops) >= 6 {
			op := pb.PoolChange_Op(int32(ops[0] % 7))
			u := binary.BigEndian.Uint32(ops[1:5]) % 64
			wrongKey := ops[5]&1 == 1
			ops = ops[6:]
			key := BucketKey(u % uint32(n))
			if wrongKey {
				key = BucketKey((u + 1) % uint32(n+1))
			}
			change := &pb.PoolChange{Op: op, Uins: []uint32{u}}
			usedBefore, pooledBefore, changes := fold.Used.Contains(u), fold.Pooled.Contains(u), fold.Changes
			fold.Apply(key, change)
			check(op.String())
			if !KeyFits(key, change, n) {
				if fold.Changes != changes || fold.Used.Contains(u) != usedBefore || fold.Pooled.Contains(u) != pooledBefore {
					t.Fatalf("%s of %d keyed by another bucket changed the fold", op, u)
				}
				continue
			}
			switch op {
			case pb.PoolChange_ALLOCATE:
				if !fold.Used.Contains(u) || fold.Pooled.Contains(u) {
					t.Fatalf("ALLOCATE %d: used %v, pooled %v", u, fold.Used.Contains(u), fold.Pooled.Contains(u))
				}
			case pb.PoolChange_INSERT:
				if usedBefore && fold.Pooled.Contains(u) {
					t.Fatalf("INSERT of %d, handed out, made it available", u)
				}
			case pb.PoolChange_FREE:
				if fold.Used.Contains(u) {
					t.Fatalf("FREE %d left it handed out", u)
				}
			}
		}
	})
}
