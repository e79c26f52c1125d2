package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/processors/uin/uinkeys"
	pb "surge/schemas/surgev1"
	"surge/streams/connect"
	"surge/streams/streamstest"
)

// Each op counts as its effect in Redis does, in the order of the uin's
// partition; a record keyed by another bucket counts for nothing.
func TestFoldCountsEachChangeAsItsEffect(t *testing.T) {
	const buckets = 10
	change := func(op pb.PoolChange_Op, uins ...uint32) *pb.PoolChange {
		return &pb.PoolChange{Op: op, Bucket: uins[0] % buckets, Uins: uins}
	}
	cases := []struct {
		name         string
		ops          []*pb.PoolChange
		used, pooled bool
	}{
		{"inserted", []*pb.PoolChange{change(pb.PoolChange_INSERT, 7)}, false, true},
		{"allocated", []*pb.PoolChange{change(pb.PoolChange_INSERT, 7), change(pb.PoolChange_ALLOCATE, 7)}, true, false},
		// A recycle batch's INSERT commits after its effect: an allocation
		// of the uin may come first; the insert then counts for nothing.
		{"insert after its allocation", []*pb.PoolChange{change(pb.PoolChange_FREE, 7), change(pb.PoolChange_ALLOCATE, 7), change(pb.PoolChange_INSERT, 7)}, true, false},
		{"released", []*pb.PoolChange{change(pb.PoolChange_INSERT, 7), change(pb.PoolChange_ALLOCATE, 7), change(pb.PoolChange_RELEASE, 7)}, false, true},
		{"release of a uin not allocated", []*pb.PoolChange{change(pb.PoolChange_RELEASE, 7)}, false, false},
		{"given back", []*pb.PoolChange{change(pb.PoolChange_INSERT, 7), change(pb.PoolChange_ALLOCATE, 7), change(pb.PoolChange_GIVEN_BACK, 7)}, false, true},
		{"freed, cooling down", []*pb.PoolChange{change(pb.PoolChange_ALLOCATE, 7), change(pb.PoolChange_FREE, 7)}, false, false},
		{"recycled", []*pb.PoolChange{change(pb.PoolChange_ALLOCATE, 7), change(pb.PoolChange_FREE, 7), change(pb.PoolChange_INSERT, 7)}, false, true},
		{"stale free of a pooled uin", []*pb.PoolChange{change(pb.PoolChange_INSERT, 7), change(pb.PoolChange_FREE, 7)}, false, true},
		{"refused", []*pb.PoolChange{change(pb.PoolChange_ALLOCATE, 7), change(pb.PoolChange_REFUSED, 7)}, true, false},
		{"claimed by a restore", []*pb.PoolChange{change(pb.PoolChange_INSERT, 7), {Op: pb.PoolChange_ALLOCATE, Bucket: 7, Uin: 7}}, true, false},
	}
	for _, tc := range cases {
		f := NewFold(buckets)
		for _, c := range tc.ops {
			f.Apply(BucketKey(c.Bucket), c)
		}
		if f.Used.Contains(7) != tc.used || f.Pooled.Contains(7) != tc.pooled {
			t.Errorf("%s: used %v pooled %v, want %v %v", tc.name, f.Used.Contains(7), f.Pooled.Contains(7), tc.used, tc.pooled)
		}
	}
	f := NewFold(buckets)
	f.Apply(BucketKey(3), change(pb.PoolChange_RELEASE, 7)) // another bucket's partition: out of order with 7's
	f.Apply(BucketKey(7), change(pb.PoolChange_INSERT, 7, 17))
	if f.Skipped != 1 || !f.Pooled.Contains(17) {
		t.Fatalf("skipped %d, pooled %v", f.Skipped, f.Pooled.ToArray())
	}
}

// Redis loses the pool while two allocators hand out uins and callers
// give some back: every change waits (ErrRebuilding) until the journal is
// folded back, and then the allocators go on. No uin is handed out twice,
// across the loss, and none is lost.
func TestPoolLostAndRebuiltHandsOutNothingTwice(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		prefix := uinkeys.Pool(streamstest.Unique("lost") + ".")
		c := newTestCentral(t, rdb, prefix, 10)
		journal := c.journal.(*memJournal)
		var all []uint32
		for u := uint32(1000); u < 4000; u++ {
			all = append(all, u)
		}
		if _, err := c.Insert(ctx, all); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		allocs := []*Allocator{NewAllocator(c, "a", LowWater(100), Chunk(300), Seed(1)), NewAllocator(c, "b", LowWater(100), Chunk(300), Seed(2))}
		for _, a := range allocs {
			go func() { _ = a.Run(rctx) }()
		}
		var mu sync.Mutex
		got := map[uint32]int{}
		take := func(a *Allocator, n int, giveBack bool) error {
			us, err := a.Allocate(ctx, n)
			if err != nil {
				return err
			}
			if giveBack {
				_, err = a.GiveBack(ctx, us[:1])
				us = us[1:]
			}
			mu.Lock()
			for _, u := range us {
				got[u]++
			}
			mu.Unlock()
			return err
		}
		for i := range 100 {
			if err := take(allocs[i%2], 5, i%10 == 0); err != nil {
				t.Fatal(err)
			}
		}
		// The loss: every key of the pool is gone.
		leasedAtLoss, err := c.Leased(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wipe(t, rdb, prefix)
		if err := take(allocs[0], 5, false); !errors.Is(err, ErrRebuilding) {
			// the local pool may serve one call before its commit is refused
			if err := take(allocs[0], 5, false); !errors.Is(err, ErrRebuilding) {
				t.Fatalf("allocation on a lost pool: %v, want ErrRebuilding", err)
			}
		}
		if _, err := c.Insert(ctx, []uint32{9999}); !errors.Is(err, ErrRebuilding) {
			t.Fatalf("insertion on a lost pool: %v, want ErrRebuilding", err)
		}
		f := journal.fold()
		if err := c.Restore(ctx, f, nil); err != nil {
			t.Fatal(err)
		}
		// Every uin received is used in the fold. A leased uin counts as
		// allocated from its lease on: those leased and not handed out at
		// the loss stay out (used, never handed out), the safe side.
		stranded := map[uint32]bool{}
		for _, u := range f.Used.ToArray() {
			if got[u] == 0 {
				stranded[u] = true
			}
		}
		for u := range got {
			if !f.Used.Contains(u) {
				t.Fatalf("uin %d was received but the journal does not say it is used", u)
			}
		}
		// A refill may lease (and journal) between the count and the wipe,
		// or lease before the wipe and journal after it: up to a refill
		// per allocator (chunk 300, or what waiting calls want) more.
		if int64(len(stranded)) > leasedAtLoss+2*(300+100) {
			t.Fatalf("%d uins journaled as allocated and never received; want at most the %d leased at the loss and a refill per allocator", len(stranded), leasedAtLoss)
		}
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			err := take(allocs[i%2], 7, false)
			if errors.Is(err, ErrRebuilding) {
				time.Sleep(5 * time.Millisecond) // the allocator finds the new generation at its next refill
				continue
			}
			if errors.Is(err, ErrExhausted) {
				if n, _ := c.Size(ctx); n == 0 && allocs[0].Held() == 0 && allocs[1].Held() == 0 {
					break
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for u, n := range got {
			if n != 1 {
				t.Errorf("uin %d handed out %d times", u, n)
			}
		}
		var missing []uint32
		for _, u := range all {
			if got[u] == 0 && !stranded[u] {
				missing = append(missing, u)
			}
		}
		// 9999 was refused; everything else inserted was handed out once.
		if len(missing) > 0 {
			t.Fatalf("%d uins never handed out after the rebuild, e.g. %v", len(missing), missing[:min(5, len(missing))])
		}
	})
}

// wipe deletes every key under prefix (on each master of a cluster; the
// keys share one hash tag, so one DEL takes them all).
func wipe(t *testing.T, rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	keys, err := connect.Scan(ctx, rdb, prefix+"*")
	if err == nil && len(keys) > 0 {
		err = rdb.Del(ctx, keys...).Err()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// The journal folds to the pool in Redis at any quiet moment: after
// allocations, give-backs, a graceful stop and a dead allocator's lease
// swept back, the fold's pooled uins are the buckets' members and its
// used uins are the used bits and the leases.
func TestJournalFoldsToThePool(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		c := newTestCentral(t, rdb, uinkeys.Pool(streamstest.Unique("fold")+"."), 10)
		journal := c.journal.(*memJournal)
		var all []uint32
		for u := uint32(5000); u < 7000; u++ {
			all = append(all, u)
		}
		if _, err := c.Insert(ctx, all); err != nil {
			t.Fatal(err)
		}
		// The fold equals Redis once the allocator is quiet: a refill's
		// lease is in Redis a moment before its record is acknowledged.
		check := func(when string) {
			t.Helper()
			var err error
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if err = foldMatches(ctx, rdb, c, journal, all); err == nil {
					return
				}
			}
			t.Fatalf("%s: %v", when, err)
		}
		rctx, cancel := context.WithCancel(ctx)
		a := NewAllocator(c, "a", LowWater(50), Chunk(200), Seed(1))
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(rctx) }()
		for range 40 {
			us, err := a.Allocate(ctx, 7)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.GiveBack(ctx, us[:2]); err != nil {
				t.Fatal(err)
			}
		}
		check("while allocating")
		// A dead owner: it leased, committed some and stopped beating.
		rng := rand.New(rand.NewPCG(3, 4))
		got, gen, err := c.lease(ctx, "dead", 100, rng)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.record(ctx, pb.PoolChange_ALLOCATE, "leased", got); err != nil {
			t.Fatal(err)
		}
		if _, err := c.commit(ctx, "dead", gen, got[:10]); err != nil {
			t.Fatal(err)
		}
		if n, err := c.SweepLapsed(ctx); err != nil || n != len(got)-10 {
			t.Fatalf("sweep returned %d (%v), want %d", n, err, len(got)-10)
		}
		check("after the sweep")
		cancel()
		<-done // a graceful stop gives the lease back
		check("after the stop")
		if n, _ := c.Leased(ctx); n != 0 {
			t.Fatalf("%d uins still leased after the stop", n)
		}
	})
}

// foldMatches compares the journal's fold with the pool in Redis: the
// buckets hold exactly the pooled uins, and a uin is used or leased
// exactly when the fold says used.
func foldMatches(ctx context.Context, rdb redis.UniversalClient, c *Central, journal *memJournal, all []uint32) error {
	f := journal.fold()
	var pooled []uint32
	for b := range c.buckets {
		ms, err := rdb.SMembers(ctx, c.bucketPrefix()+strconv.Itoa(b)).Result()
		if err != nil {
			return err
		}
		pooled = append(pooled, parseUins(ms)...)
	}
	slices.Sort(pooled)
	if want := f.Pooled.ToArray(); !slices.Equal(pooled, want) {
		return fmt.Errorf("the buckets hold %d uins, the journal says %d are pooled", len(pooled), len(want))
	}
	used, err := c.Status(ctx, all)
	if err != nil {
		return err
	}
	owners, err := rdb.SMembers(ctx, c.leasesKey()).Result()
	if err != nil {
		return err
	}
	leased := map[uint32]bool{}
	for _, o := range owners {
		ms, err := rdb.SMembers(ctx, c.leaseKey(o)).Result()
		if err != nil {
			return err
		}
		for _, u := range parseUins(ms) {
			leased[u] = true
		}
	}
	for i, u := range all {
		if f.Used.Contains(u) != (used[i] || leased[u]) {
			return fmt.Errorf("uin %d used %v leased %v, the journal says used %v", u, used[i], leased[u], f.Used.Contains(u))
		}
	}
	return nil
}
