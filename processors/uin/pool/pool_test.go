package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/streams/streamstest"
)

// Four stateless allocators with local pools, eight callers each, drain a
// pool of 20,000 uins: every uin is handed out once, none twice, and the
// used ones can never go back into the pool.
func TestNoUinAllocatedTwice(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb *redis.Client) {
		c := NewCentral(rdb, streamstest.Unique("pool")+":", 1000)
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
			a := NewAllocator(c, 200, 500, uint64(i+1))
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
						u, err := a.Allocate()
						if errors.Is(err, ErrExhausted) {
							if n, _ := c.Size(ctx); n == 0 && a.Held() == 0 {
								return
							}
							time.Sleep(time.Millisecond)
							continue
						}
						mu.Lock()
						got[u]++
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
				if u, err := a.Allocate(); err == nil {
					got[u]++
				}
			}
		}
		cancel()
		runs.Wait() // final used marks flushed
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
	streamstest.EachRedis(t, func(t *testing.T, rdb *redis.Client) {
		c := NewCentral(rdb, streamstest.Unique("pool")+":", 10)
		ctx := context.Background()
		if _, err := c.Insert(ctx, []uint32{7}); err != nil {
			t.Fatal(err)
		}
		a := NewAllocator(c, 1, 10, 1)
		if err := a.fill(ctx); err != nil || a.Held() != 1 {
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
	streamstest.EachRedis(t, func(t *testing.T, rdb *redis.Client) {
		c := NewCentral(rdb, streamstest.Unique("pool")+":", 10)
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
	c := NewCentral(rdb, streamstest.Unique("bench")+":", 1000)
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
		a := NewAllocator(c, low, chunk, uint64(i+1))
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
				if _, err := a.Allocate(); err == nil {
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
