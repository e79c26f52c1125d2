package numpkg

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

// FuzzDecode: a number package read from any bytes is refused or is a
// non-empty target set that encodes back to a package of the same set;
// no input panics the reader (packages come from other teams' uploads).
func FuzzDecode(f *testing.F) {
	for _, uins := range [][]uint32{{1}, {1, 2, 3, 1 << 31}, {0, 70000, 4294967295}} {
		b, err := Encode(roaring.BitmapOf(uins...))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Most inputs fail the checksum; half the time the header is made
		// right for the body, so the bitmap reader itself is fuzzed.
		if len(data) > headerSize && data[0]&1 == 1 {
			data = append([]byte(magic), data[4:]...)
			binary.BigEndian.PutUint16(data[4:], version)
			binary.BigEndian.PutUint32(data[14:], crc32.Checksum(data[headerSize:], castagnoli))
		}
		b, err := Decode(data)
		if err != nil {
			return
		}
		if b.IsEmpty() {
			t.Fatal("an empty package decoded")
		}
		again, err := Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(again)
		if err != nil || !back.Equals(b) {
			t.Fatalf("re-encoded package reads as %v (%v), was %v", back, err, b)
		}
	})
}
