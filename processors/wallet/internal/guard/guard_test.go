package guard

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/streams/streamstest"
)

func TestBucket(t *testing.T) {
	b := NewBucket(100)
	n := 0
	for b.Allow(1) {
		n++
	}
	if n != 100 {
		t.Fatalf("burst of %d, want 100", n)
	}
	time.Sleep(50 * time.Millisecond)
	if !b.Allow(3) {
		t.Fatal("no refill after 50 ms at 100/s")
	}
	b.SetRate(0)
	for range 1000 {
		if !b.Allow(1) {
			t.Fatal("rate 0 must be unlimited")
		}
	}
}

// Two instances share one distributed limit.
func TestGlobalLimit(t *testing.T) {
	run := func(t *testing.T, rdb *redis.Client) {
		name := streamstest.Unique("grants")
		a, b := NewGlobal(rdb, "lim:"), NewGlobal(rdb, "lim:")
		// Stay inside one wall-clock second.
		if ms := time.Now().UnixMilli() % 1000; ms > 700 {
			time.Sleep(time.Duration(1000-ms) * time.Millisecond)
		}
		allowed := 0
		for i := range 100 {
			g := a
			if i%2 == 1 {
				g = b
			}
			ok, err := g.Allow(context.Background(), name, 30, 1)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				allowed++
			}
		}
		if allowed != 30 {
			t.Fatalf("%d allowed in one second over two instances, limit 30", allowed)
		}
	}
	t.Run("miniredis", func(t *testing.T) { run(t, redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})) })
	t.Run("redis", func(t *testing.T) {
		rdb, ok := streamstest.RedisClient(t)
		if !ok {
			t.Skip("no real redis")
		}
		run(t, rdb)
	})
}
