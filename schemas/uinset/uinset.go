// Package uinset reads the sets of uins that records and local state
// carry as roaring bitmaps (the portable format). roaring's reader takes
// what the header says on trust: a damaged or hostile set (unsorted or
// overlapping containers, a run past 65535) decodes without an error and
// panics later, in an iterator or RunOptimize (found by numpkg's
// FuzzDecode). Every set read from a topic or a file goes through here,
// which validates it, so such a set is refused where it is read.
package uinset

import (
	"bytes"
	"fmt"
	"io"

	"github.com/RoaringBitmap/roaring/v2"
)

// Decode reads a set written by (*roaring.Bitmap).ToBytes or WriteTo.
func Decode(b []byte) (*roaring.Bitmap, error) {
	return Read(bytes.NewReader(b))
}

// Read reads a set from r and checks that it is well formed.
func Read(r io.Reader) (*roaring.Bitmap, error) {
	set := roaring.New()
	if _, err := set.ReadFrom(r); err != nil {
		return nil, fmt.Errorf("uin set: %w", err)
	}
	if err := set.Validate(); err != nil {
		return nil, fmt.Errorf("uin set: malformed: %w", err)
	}
	return set, nil
}
