package uinset

import (
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

// FuzzDecode: a set read from any bytes is refused, or is one every
// operation the processors use (iterate, run-optimise, encode) handles
// and that reads back the same.
func FuzzDecode(f *testing.F) {
	for _, uins := range [][]uint32{{}, {1}, {1, 2, 3, 1 << 31}, {0, 70000, 4294967295}} {
		b, err := roaring.BitmapOf(uins...).ToBytes()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	run := roaring.New()
	run.AddRange(10, 100000)
	run.RunOptimize()
	b, _ := run.ToBytes()
	f.Add(b)
	// The package FuzzDecode of numpkg found: an array container whose
	// values are out of order, read without an error by roaring.
	f.Add([]byte("0000:0\x00\x00\x02\x00\x00\x0000\x02\x0000\x00\x000000000000000000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		set, err := Decode(b)
		if err != nil {
			return
		}
		n := uint64(0)
		for it := set.Iterator(); it.HasNext(); it.Next() {
			n++
		}
		if n != set.GetCardinality() {
			t.Fatalf("iterated %d of %d", n, set.GetCardinality())
		}
		set.RunOptimize()
		again, err := set.ToBytes()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(again)
		if err != nil || !back.Equals(set) {
			t.Fatalf("re-encoded set reads as %v (%v)", back, err)
		}
	})
}

func TestMalformedSetIsRefused(t *testing.T) {
	if _, err := Decode([]byte("0000:0\x00\x00\x02\x00\x00\x0000\x02\x0000\x00\x000000000000000000")); err == nil {
		t.Fatal("a set with out-of-order values was read")
	}
	if set, err := Decode(mustBytes(roaring.BitmapOf(5, 7))); err != nil || set.GetCardinality() != 2 {
		t.Fatalf("a good set: %v %v", set, err)
	}
}

func mustBytes(b *roaring.Bitmap) []byte {
	out, err := b.ToBytes()
	if err != nil {
		panic(err)
	}
	return out
}
