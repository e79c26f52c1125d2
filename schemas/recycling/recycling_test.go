package recycling

import (
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Batches hands out a partition's batch when it is full and the rest at
// the end: every step once, each batch of one partition, none over max.
func TestBatchesPerPartition(t *testing.T) {
	const partitions, max, n = 4, 5, 103
	b := NewBatches(partitions, max)
	var batches [][]uint64
	take := func(steps []*pb.RecycleStep) {
		var uins []uint64
		for _, s := range steps {
			uins = append(uins, s.Uin)
		}
		batches = append(batches, uins)
	}
	for u := uint32(1); u <= n; u++ {
		if full := b.Add(Grant(Finding{Uin: u, Category: Inactive}, time.Unix(0, 0))); full != nil {
			if len(full) != max {
				t.Fatalf("a full batch of %d, want %d", len(full), max)
			}
			take(full)
		}
	}
	for _, rest := range b.Rest() {
		if len(rest) == 0 || len(rest) >= max {
			t.Fatalf("a rest batch of %d (max %d)", len(rest), max)
		}
		take(rest)
	}
	if len(b.Rest()) != 0 {
		t.Fatal("Rest twice gave batches twice")
	}
	seen := map[uint64]bool{}
	for _, uins := range batches {
		p := streams.PartitionFor(schemas.UinKey(uint32(uins[0])), partitions)
		for _, u := range uins {
			if seen[u] {
				t.Fatalf("uin %d in two batches", u)
			}
			seen[u] = true
			if q := streams.PartitionFor(schemas.UinKey(uint32(u)), partitions); q != p {
				t.Fatalf("uin %d of partition %d in a batch of partition %d", u, q, p)
			}
		}
	}
	if len(seen) != n {
		t.Fatalf("%d uins batched, want %d", len(seen), n)
	}
}
