package pool

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "surge/schemas/surgev1"
)

// memJournal keeps the changes written to it, with their bucket keys, in
// order: the tests fold it as Rebuild folds uin.pool.
type memJournal struct {
	buckets int
	mu      sync.Mutex
	keys    [][]byte
	changes []*pb.PoolChange
}

func (j *memJournal) Write(_ context.Context, op pb.PoolChange_Op, reason string, uins []uint32) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, c := range Changes(op, reason, uins, j.buckets, time.Now()) {
		j.keys, j.changes = append(j.keys, BucketKey(c.Bucket)), append(j.changes, c)
	}
	return nil
}

// add appends a change made outside the journal (a recycle controller's
// record).
func (j *memJournal) add(c *pb.PoolChange) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.keys, j.changes = append(j.keys, BucketKey(c.Bucket)), append(j.changes, c)
}

func (j *memJournal) fold() *Fold {
	j.mu.Lock()
	defer j.mu.Unlock()
	f := NewFold(j.buckets)
	for i, c := range j.changes {
		f.Apply(j.keys[i], c)
	}
	return f
}

// newTestCentral is a central pool journaling in memory, its generation
// set (an empty pool, as a rebuild of an empty topic leaves it).
func newTestCentral(tb testing.TB, rdb redis.UniversalClient, prefix string, buckets int) *Central {
	c := NewCentral(rdb, prefix, buckets).WithJournal(&memJournal{buckets: buckets})
	if err := c.Restore(context.Background(), NewFold(buckets), nil); err != nil {
		tb.Fatal(err)
	}
	return c
}
