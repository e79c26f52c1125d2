package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/processors/uin/uinkeys"
	"surge/streams/streamstest"
)

// Four stateless allocators with local pools, eight callers each, drain a
// pool of 20,000 uins: every uin is handed out once, none twice, and the
// used ones can never go back into the pool.
func TestNoUinAllocatedTwice(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestCentral(t, rdb, uinkeys.Pool(streamstest.Unique("pool")+"."), 1000)
		ctx := context.Background()
		var uins []uint32
		for u := uint32(100_000); u < 120_000; u++ {
			uins = append(uins, u)
		}
		errs, err := c.Insert(ctx, uins)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range errs {
			if e != nil {
				t.Fatal(e)
			}
		}
		// The same uins again: refused as already pooled.
		errs, _ = c.Insert(ctx, uins[:10])
		for _, e := range errs {
			if !errors.Is(e, ErrInPool) {
				t.Fatalf("re-insert: %v", e)
			}
		}
		rctx, cancel := context.WithCancel(ctx)
		var allocs []*Allocator
		var runs sync.WaitGroup
		for i := range 4 {
			a := NewAllocator(c, "a", LowWater(200), Chunk(500), Seed(uint64(i+1)))
			allocs = append(allocs, a)
			runs.Add(1)
			go func() { defer runs.Done(); _ = a.Run(rctx) }()
		}
		var mu sync.Mutex
		got := map[uint32]int{}
		var wg sync.WaitGroup
		deadline := time.Now().Add(30 * time.Second)
		for _, a := range allocs {
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(deadline) {
						us, err := a.Allocate(ctx, 1+int(time.Now().UnixNano()%5))
						if errors.Is(err, ErrExhausted) {
							if n, _ := c.Size(ctx); n == 0 && a.Held() == 0 {
								return
							}
							time.Sleep(time.Millisecond)
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						for _, u := range us {
							got[u]++
						}
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		// A caller may have left while its allocator's last lease was in
		// flight: take what the local pools still hold.
		time.Sleep(200 * time.Millisecond)
		for _, a := range allocs {
			for a.Held() > 0 {
				us, _ := a.Allocate(ctx, 100)
				for _, u := range us {
					got[u]++
				}
			}
		}
		cancel()
		runs.Wait()
		if len(got) != len(uins) {
			t.Fatalf("%d distinct uins allocated of %d", len(got), len(uins))
		}
		for u, n := range got {
			if n != 1 {
				t.Fatalf("uin %d allocated %d times", u, n)
			}
		}
		errs, _ = c.Insert(ctx, uins[:100])
		for _, e := range errs {
			if !errors.Is(e, ErrInUse) {
				t.Fatalf("a used uin went back: %v", e)
			}
		}
	})
}

// A leased uin (in a local pool, not yet handed out) cannot be inserted.
func TestLeasedRefused(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestCentral(t, rdb, uinkeys.Pool(streamstest.Unique("pool")+"."), 10)
		ctx := context.Background()
		if _, err := c.Insert(ctx, []uint32{7}); err != nil {
			t.Fatal(err)
		}
		a := NewAllocator(c, "a", LowWater(1), Chunk(10))
		if err := a.fill(ctx, rand.New(rand.NewPCG(1, 2))); err != nil || a.Held() != 1 {
			t.Fatalf("fill: %v, held %d", err, a.Held())
		}
		errs, _ := c.Insert(ctx, []uint32{7})
		if !errors.Is(errs[0], ErrLeased) {
			t.Fatalf("leased uin re-inserted: %v", errs[0])
		}
		// Nor can a restore claim it back: a local pool holds it.
		if ok, err := c.Claim(ctx, 7); err != nil || ok {
			t.Fatalf("claimed a leased uin: %v %v", ok, err)
		}
	})
}

// A restore claims a pooled uin out of its bucket, and a freed one; it
// cannot claim one in use, and a claimed uin cannot be pooled again.
func TestClaim(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestCentral(t, rdb, uinkeys.Pool(streamstest.Unique("pool")+"."), 10)
		ctx := context.Background()
		if _, err := c.Insert(ctx, []uint32{21, 22}); err != nil {
			t.Fatal(err)
		}
		if ok, err := c.Claim(ctx, 21); err != nil || !ok {
			t.Fatalf("claim of a pooled uin: %v %v", ok, err)
		}
		if n, _ := c.Size(ctx); n != 1 {
			t.Fatalf("pool holds %d after the claim, want 1", n)
		}
		if ok, _ := c.Claim(ctx, 21); ok {
			t.Fatal("claimed a uin in use")
		}
		if errs, _ := c.Insert(ctx, []uint32{21}); !errors.Is(errs[0], ErrInUse) {
			t.Fatalf("a claimed uin went back into the pool: %v", errs[0])
		}
		if ok, err := c.Claim(ctx, 99); err != nil || !ok {
			t.Fatalf("claim of a free uin: %v %v", ok, err)
		}
		if refused, err := c.InsertIfFree(ctx, []uint32{99, 22}); err != nil || len(refused) != 1 || refused[0] != 99 {
			t.Fatalf("InsertIfFree: refused %v (%v), want only the claimed 99", refused, err)
		}
	})
}

// BenchmarkAllocate is allocations per second from local pools with
// concurrent callers (the refills from Redis run in the background).
// benchPool fills a central pool with total uins and starts 4 allocators
// that hold low uins each (pulling chunk at a time) once Held says so.
func benchPool(b *testing.B, total, low, chunk int) []*Allocator {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(b).Addr()})
	if r, ok := streamstest.RedisClient(b); ok {
		rdb = r
	}
	c := newTestCentral(b, rdb, uinkeys.Pool(streamstest.Unique("bench")+"."), 1000)
	ctx := context.Background()
	for lo := 1; lo <= total; lo += 100_000 {
		var uins []uint32
		for u := lo; u < lo+100_000 && u <= total; u++ {
			uins = append(uins, uint32(u))
		}
		if _, err := c.Insert(ctx, uins); err != nil {
			b.Fatal(err)
		}
	}
	rctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	var allocs []*Allocator
	for i := range 4 {
		a := NewAllocator(c, "bench", LowWater(low), Chunk(chunk), Seed(uint64(i+1)))
		allocs = append(allocs, a)
		go func() { _ = a.Run(rctx) }()
	}
	for _, a := range allocs {
		for a.Held() < low {
			time.Sleep(time.Millisecond)
		}
	}
	return allocs
}

// allocateParallel allocates b.N uins from 4 allocators, 2 callers each
// per core, retrying while a local pool waits for its refill.
func allocateParallel(b *testing.B, allocs []*Allocator) {
	var i atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		a := allocs[i.Add(1)%int64(len(allocs))]
		for pb.Next() {
			for {
				if _, err := a.Allocate(context.Background(), 1); err == nil {
					break
				}
				time.Sleep(10 * time.Microsecond)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "allocs/s")
}

// BenchmarkAllocateFromLocalPools: allocations served by local pools that
// hold enough (the allocation path itself: no Redis on it). Run with
// -benchtime of at most 1.6M allocations.
func BenchmarkAllocateFromLocalPools(b *testing.B) {
	allocs := benchPool(b, 2_000_000, 400_000, 100_000)
	if b.N > 1_600_000 {
		b.Fatalf("b.N %d exceeds what the local pools hold; use -benchtime 1500000x", b.N)
	}
	allocateParallel(b, allocs)
}

// BenchmarkAllocateWithRefill: local pools start small and must keep
// pulling from the central pool, so the figure is bound by the central
// pool's supply (Redis: SPOP of held uins, mark used).
func BenchmarkAllocateWithRefill(b *testing.B) {
	allocs := benchPool(b, 2_000_000, 50_000, 100_000)
	allocateParallel(b, allocs)
}

// A lease whose owner died (no heartbeat) goes back to the buckets on the
// next sweep, and the dead owner, should it come back, can no longer hand
// out any uin of it: nothing is stranded, nothing is handed out twice.
func TestLapsedLeaseReturnsAndCannotBeCommitted(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestCentral(t, rdb, uinkeys.Pool(streamstest.Unique("pool")+"."), 10)
		ctx := context.Background()
		var uins []uint32
		for u := uint32(500); u < 600; u++ {
			uins = append(uins, u)
		}
		if _, err := c.Insert(ctx, uins); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		// The owner "dead" leases everything and commits ten, then stops
		// beating (it was killed -9: no lease given back).
		var leased []uint32
		for len(leased) < len(uins) {
			got, _, err := c.lease(ctx, "dead", 100, rng)
			if err != nil {
				t.Fatal(err)
			}
			leased = append(leased, got...)
		}
		gen, _ := rdb.Get(ctx, c.gen()).Result()
		handed, err := c.commit(ctx, "dead", gen, leased[:10])
		if err != nil || len(handed) != 10 {
			t.Fatalf("commit: %v %v", handed, err)
		}
		if n, _ := c.Size(ctx); n != 0 {
			t.Fatalf("pool holds %d while all is leased", n)
		}
		// While it is alive, a sweep leaves its lease alone.
		if err := rdb.Set(ctx, c.aliveKey("dead"), time.Now().Add(time.Minute).UnixMilli(), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := c.SweepLapsed(ctx); err != nil || n != 0 {
			t.Fatalf("sweep of a live owner returned %d (%v)", n, err)
		}
		rdb.Set(ctx, c.aliveKey("dead"), time.Now().Add(-time.Second).UnixMilli(), time.Minute) // lapsed
		if n, err := c.SweepLapsed(ctx); err != nil || n != 90 {
			t.Fatalf("sweep returned %d (%v), want the 90 never handed out", n, err)
		}
		if n, _ := c.Size(ctx); n != 90 {
			t.Fatalf("pool holds %d after the sweep, want 90", n)
		}
		if n, _ := c.Leased(ctx); n != 0 {
			t.Fatalf("%d still leased", n)
		}
		// The dead owner's late commit of what it still had in memory
		// hands out nothing.
		if late, err := c.commit(ctx, "dead", gen, leased[10:]); err != nil || len(late) != 0 {
			t.Fatalf("late commit handed out %v (%v)", late, err)
		}
		// A live allocator gets exactly the 90, each once.
		rctx, cancel := context.WithCancel(ctx)
		a := NewAllocator(c, "live", LowWater(50), Chunk(50))
		done := make(chan error, 1)
		go func() { done <- a.Run(rctx) }()
		seen := map[uint32]bool{}
		for _, u := range handed {
			seen[u] = true
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(seen) < 100 && time.Now().Before(deadline) {
			us, err := a.Allocate(ctx, 7)
			if errors.Is(err, ErrExhausted) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range us {
				if seen[u] {
					t.Fatalf("uin %d handed out twice", u)
				}
				seen[u] = true
			}
		}
		if len(seen) != 100 {
			t.Fatalf("%d of 100 uins handed out", len(seen))
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// A graceful stop gives the local pool back: nothing stays leased.
func TestStopReturnsLease(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := newTestCentral(t, rdb, uinkeys.Pool(streamstest.Unique("pool")+"."), 10)
		ctx := context.Background()
		var uins []uint32
		for u := uint32(1); u <= 1000; u++ {
			uins = append(uins, u)
		}
		if _, err := c.Insert(ctx, uins); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		a := NewAllocator(c, "s", LowWater(300), Chunk(300))
		done := make(chan error, 1)
		go func() { done <- a.Run(rctx) }()
		us, err := a.Allocate(ctx, 5)
		if err != nil || len(us) != 5 {
			t.Fatalf("allocate: %v %v", us, err)
		}
		if n, _ := c.Leased(ctx); n == 0 {
			t.Fatal("nothing leased while running")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n, _ := c.Leased(ctx); n != 0 {
			t.Fatalf("%d uins still leased after a graceful stop", n)
		}
		if n, _ := c.Size(ctx); n != 995 {
			t.Fatalf("pool holds %d, want 995", n)
		}
		if _, err := a.Allocate(ctx, 1); !errors.Is(err, ErrStopped) && !errors.Is(err, ErrExhausted) {
			t.Fatalf("allocate after stop: %v", err)
		}
	})
}

// The pool's scripts run by SHA; a server that does not know them (a
// fresh or restarted one, here a flushed script cache) gets them loaded
// and the call made again, once. Freeing and reading bits in bulk works
// on a server without BITFIELD too (miniredis).
func TestScriptsLoadedWhenTheServerLostThem(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	ctx := context.Background()
	c := newTestCentral(t, rdb, "p:", 10)
	for round := range 2 {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		uins := make([]uint32, 0, 1200)
		for u := range uint32(1200) {
			uins = append(uins, 10_000*uint32(round+1)+u)
		}
		refused, err := c.InsertIfFree(ctx, uins)
		if err != nil || len(refused) != 0 {
			t.Fatalf("round %d: refused %v, %v", round, refused, err)
		}
		if err := c.putBits(ctx, uins[:600], 1, c.used()); err != nil { // accounts took half
			t.Fatal(err)
		}
		used, err := c.Status(ctx, uins)
		if err != nil {
			t.Fatal(err)
		}
		for i, u := range used {
			if u != (i < 600) {
				t.Fatalf("round %d: uin %d used %v", round, uins[i], u)
			}
		}
		// Deleting the accounts frees the used half; the pooled half
		// (held, no account) keeps its bits: a stale deletion must not
		// let a pooled or leased uin into a bucket twice.
		kept, err := c.Free(ctx, uins...)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(kept, uins[600:]) {
			t.Fatalf("round %d: Free kept %d uins, want the %d pooled ones", round, len(kept), len(uins[600:]))
		}
		if used, _ := c.Status(ctx, uins[:1]); used[0] {
			t.Fatalf("round %d: freed uin still used", round)
		}
		if codes, err := c.insert(ctx, uins[600:601]); err != nil || codes[0] != 2 {
			t.Fatalf("round %d: pooled uin inserted again after a stale deletion: code %v, %v", round, codes, err)
		}
	}
}

// putBits (accounts taking uins, in the tests) sets the uins' bits in each of keys to bit, with BITFIELD, a
// thousand per command: one command object per thousand uins, not one per
// uin.
func (c *Central) putBits(ctx context.Context, uins []uint32, bit int, keys ...string) error {
	pipe := c.rdb.Pipeline()
	for _, key := range keys {
		if c.noBitfield.Load() {
			for _, u := range uins {
				pipe.SetBit(ctx, key, int64(u), bit)
			}
		} else {
			bitfields(ctx, pipe, key, uins, func(args []any, u uint32) []any { return append(args, "SET", "u1", u, bit) })
		}
	}
	_, err := pipe.Exec(ctx)
	if c.lacksBitfield(err) {
		return c.putBits(ctx, uins, bit, keys...)
	}
	return err
}
