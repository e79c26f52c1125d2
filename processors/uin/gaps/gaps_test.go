package gaps

import (
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

func TestFind(t *testing.T) {
	alloc := roaring.New()
	alloc.AddRange(1000, 2000)
	alloc.Remove(1500) // jumped over
	alloc.AddRange(5000, 5100)
	g := Find(alloc, []Range{{1000, 2000}, {5000, 5200}})
	want := roaring.BitmapOf(1500)
	want.AddRange(5100, 5200)
	if !g.Equals(want) {
		t.Fatalf("gaps %v", g.ToArray())
	}
	if !Find(alloc, nil).IsEmpty() {
		t.Fatal("gaps outside every range")
	}
}
