// Package gaps finds the uins that jump allocation skipped: within the
// allocated ranges, every uin never allocated is a gap, recoverable into
// the pool. The allocated set is a roaring bitmap (4 billion bits would be
// 512 MiB; roaring holds runs of allocations in a few bytes each).
package gaps

import "github.com/RoaringBitmap/roaring/v2"

// Range is an allocated range [From, To).
type Range struct{ From, To uint64 }

// Find returns the uins in the ranges that are not in allocated.
func Find(allocated *roaring.Bitmap, ranges []Range) *roaring.Bitmap {
	out := roaring.New()
	for _, r := range ranges {
		out.AddRange(r.From, r.To)
	}
	out.AndNot(allocated)
	return out
}
