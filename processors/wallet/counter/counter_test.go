package counter

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/streams/streamstest"
)

// Sixteen instances add under load for two seconds, each flushing once a
// second (here every 100 ms, the same mechanism faster); at the end the
// shown total is within 1% of the true total, it never went down, and the
// backup holds the same total.
func TestShownWithinOnePercent(t *testing.T) {
	run := func(t *testing.T, primary, backup *redis.Client) {
		key := streamstest.Unique("total")
		ctx, cancel := context.WithCancel(context.Background())
		var truth atomic.Int64
		var counters []*Counter
		var wg, flushers sync.WaitGroup
		for range 16 {
			c := New(primary, backup, key, nil)
			counters = append(counters, c)
			flushers.Add(1)
			go func() { defer flushers.Done(); c.Run(ctx, 100*time.Millisecond) }()
		}
		stopAdding := time.Now().Add(2 * time.Second)
		for i, c := range counters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 1))
				var last int64
				for time.Now().Before(stopAdding) {
					n := int64(1 + rng.IntN(100))
					c.Add(n)
					truth.Add(n)
					if s := c.Shown(); s < last {
						t.Errorf("shown total went down: %d after %d", s, last)
					} else {
						last = s
					}
				}
			}()
		}
		wg.Wait()
		time.Sleep(300 * time.Millisecond) // one more flush and refresh
		want := truth.Load()
		for _, c := range counters {
			if got := c.Shown(); float64(want-got) > 0.01*float64(want) || got > want {
				t.Fatalf("shown %d, true %d (%.2f%% off)", got, want, 100*float64(want-got)/float64(want))
			}
		}
		cancel()
		flushers.Wait() // final flushes
		if v, _ := primary.Get(context.Background(), key).Int64(); v != want {
			t.Fatalf("primary holds %d, true %d", v, want)
		}
		if v, _ := backup.Get(context.Background(), key).Int64(); v != want {
			t.Fatalf("backup holds %d, true %d", v, want)
		}
		// The read switch: served from the backup, same value.
		c := New(primary, backup, key, nil)
		c.ReadFromBackup(true)
		c.Refresh(context.Background())
		if c.Shown() != want {
			t.Fatalf("read from backup: %d", c.Shown())
		}
		t.Logf("true total %d after %d flushes", want, counters[0].Flushes.Load())
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
