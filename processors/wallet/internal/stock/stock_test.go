package stock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"surge/processors/wallet/internal/tally"
	"surge/streams/streamstest"
)

// Many issuers at once on one hot template, split over keys: never more
// than the sellable stock (total minus the 5% buffer) is given out, and all
// of it is, before refusals start.
func TestNeverOversold(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		tpl := streamstest.Unique("tpl")
		const total = 10_000
		issuers := make([]*Control, 8) // separate instances, same Redis
		for i := range issuers {
			issuers[i] = New(rdb, tally.New(rdb, true), "test:", 16)
		}
		var ok, out atomic.Int64
		var wg sync.WaitGroup
		for _, c := range issuers {
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 400 {
						err := c.Take(context.Background(), tpl, total, 1)
						switch {
						case err == nil:
							ok.Add(1)
						case errors.Is(err, ErrOut):
							out.Add(1)
						default:
							t.Error(err)
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		sellable := int64(total - total*BufferShare)
		if ok.Load() != sellable {
			t.Fatalf("sold %d, sellable %d (refused %d)", ok.Load(), sellable, out.Load())
		}
		rem, err := issuers[0].Remaining(context.Background(), tpl, total)
		if err != nil || rem != 0 {
			t.Fatalf("remaining %d %v", rem, err)
		}
		stop, _ := issuers[0].ShouldStop(context.Background(), tpl, total)
		if !stop {
			t.Fatal("issuers not told to stop with nothing left")
		}
	})
}

func TestStopThreshold(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		c := New(rdb, tally.New(rdb, true), "test:", 4)
		tpl := streamstest.Unique("tpl")
		ctx := context.Background()
		// 1000 total: 950 sellable; stop once fewer than 100 remain.
		if err := c.Take(ctx, tpl, 1000, 840); err == nil {
			t.Fatal("a take larger than one key's share succeeded")
		}
		for i := range 840 {
			if err := c.Take(ctx, tpl, 1000, 1); err != nil {
				t.Fatal(fmt.Errorf("take %d: %w", i, err))
			}
		}
		if stop, _ := c.ShouldStop(ctx, tpl, 1000); stop {
			t.Fatal("stopped with 110 left")
		}
		for range 20 {
			_ = c.Take(ctx, tpl, 1000, 1)
		}
		if stop, _ := c.ShouldStop(ctx, tpl, 1000); !stop {
			t.Fatal("not stopped with 90 left")
		}
	})
}
