package counter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/streams/streamstest"
)

// Sixteen publishers, each the owner of two partitions, publish their
// cumulative sums under load while a former owner of every partition
// keeps publishing stale (smaller) sums. The shown total never goes down,
// never exceeds the truth, and ends equal to it, on the primary and the
// backup; stale and repeated publishes change nothing.
func TestTotalIsTheSumOfCumulativeSums(t *testing.T) {
	run := func(t *testing.T, primary, backup *redis.Client) {
		key := streamstest.Unique("total")
		ctx := context.Background()
		reader := New(primary, backup, key, nil)
		rctx, stopReader := context.WithCancel(ctx)
		defer stopReader()
		go reader.Run(rctx, 20*time.Millisecond)

		const owners, perOwner = 16, 2
		truth := make([]int64, owners*perOwner)
		var mu sync.Mutex
		var wg sync.WaitGroup
		stop := time.Now().Add(time.Second)
		for o := range owners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := New(primary, backup, key, nil)
				rng := rand.New(rand.NewPCG(uint64(o), 1))
				sums := map[int32]int64{}
				for time.Now().Before(stop) {
					p := int32(o*perOwner + rng.IntN(perOwner))
					sums[p] += int64(1 + rng.IntN(100))
					mu.Lock()
					truth[p] = sums[p]
					mu.Unlock()
					if err := c.Publish(ctx, map[int32]int64{p: sums[p]}); err != nil {
						t.Error(err)
						return
					}
				}
				_ = c.Publish(ctx, sums) // published again: no change
			}()
		}
		wg.Add(1)
		go func() { // the former owner: sums from before, late
			defer wg.Done()
			c := New(primary, backup, key, nil)
			for time.Now().Before(stop) {
				p := int32(rand.IntN(owners * perOwner))
				mu.Lock()
				stale := truth[p] / 2
				mu.Unlock()
				_ = c.Publish(ctx, map[int32]int64{p: stale})
			}
		}()
		var last int64
		for time.Now().Before(stop) {
			if s := reader.Shown(); s < last {
				t.Fatalf("shown total went down: %d after %d", s, last)
			} else {
				last = s
			}
			time.Sleep(5 * time.Millisecond)
		}
		wg.Wait()
		var want int64
		for _, v := range truth {
			want += v
		}
		deadline := time.Now().Add(2 * time.Second)
		for reader.Shown() != want {
			if time.Now().After(deadline) {
				t.Fatalf("shown %d, true %d", reader.Shown(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		for name, c := range map[string]*redis.Client{"primary": primary, "backup": backup} {
			r := New(c, nil, key, nil)
			if got, err := r.Total(ctx); err != nil || got != want {
				t.Fatalf("%s holds %d (%v), true %d", name, got, err, want)
			}
		}
		// The read switch: served from the backup, same value.
		c := New(primary, backup, key, nil)
		c.ReadFromBackup(true)
		c.Refresh(ctx)
		if c.Shown() != want {
			t.Fatalf("read from backup: %d", c.Shown())
		}
		if n, _ := primary.HLen(ctx, key).Result(); n != owners*perOwner {
			t.Fatalf("hash has %d fields, want %d (one per partition)", n, owners*perOwner)
		}
		t.Logf("true total %s", fmt.Sprint(want))
	}
	t.Run("miniredis", func(t *testing.T) {
		p, b := miniredis.RunT(t), miniredis.RunT(t)
		run(t, redis.NewClient(&redis.Options{Addr: p.Addr()}), redis.NewClient(&redis.Options{Addr: b.Addr()}))
	})
	t.Run("redis", func(t *testing.T) {
		rdb, ok := streamstest.RedisClient(t)
		if !ok {
			t.Skip("no real redis: set SURGE_TEST_REDIS")
		}
		// The backup is database 1 of the same server.
		b := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DB: 1})
		run(t, rdb, b)
	})
}

// The degrade switch counter_primary: with the primary down, publishes
// still reach the backup and succeed, and reads come from it; with the
// switch off again (the primary back), reads are the primary's.
func TestSwitchReadsTheBackupWhileThePrimaryIsDown(t *testing.T) {
	ctx := context.Background()
	p, b := miniredis.RunT(t), miniredis.RunT(t)
	primary, backup := redis.NewClient(&redis.Options{Addr: p.Addr()}), redis.NewClient(&redis.Options{Addr: b.Addr()})
	var mu sync.Mutex
	degraded := false
	c := New(primary, backup, "total", nil)
	c.FollowSwitch(func() bool { mu.Lock(); defer mu.Unlock(); return degraded })
	if err := c.Publish(ctx, map[int32]int64{0: 100, 1: 20}); err != nil {
		t.Fatal(err)
	}
	c.Refresh(ctx)
	if c.Shown() != 120 {
		t.Fatalf("shown %d, want 120", c.Shown())
	}
	p.SetError("primary down")
	if err := c.Publish(ctx, map[int32]int64{0: 150}); err == nil {
		t.Fatal("publish with the primary down and reads on it: no error")
	}
	mu.Lock()
	degraded = true
	mu.Unlock()
	if err := c.Publish(ctx, map[int32]int64{0: 170}); err != nil {
		t.Fatalf("publish on the backup: %v", err)
	}
	c.Refresh(ctx)
	if c.Shown() != 190 {
		t.Fatalf("shown %d from the backup, want 190", c.Shown())
	}
	p.SetError("")
	mu.Lock()
	degraded = false
	mu.Unlock()
	if got, err := c.Total(ctx); err != nil || got != 120 {
		t.Fatalf("primary back: total %d (%v), want its 120 (it missed the writes while down)", got, err)
	}
	c.Refresh(ctx)
	if c.Shown() != 190 {
		t.Fatalf("shown went down to %d", c.Shown())
	}
}
