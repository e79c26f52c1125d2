package app_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/app"
	"surge/processors/uin/pool"
	"surge/schemas"
	"surge/schemas/recycling"
	"surge/streams"
	"surge/streams/streamstest"
)

// TestReclassifyingHandsEveryUinOutOnce: a scheduled classification runs
// again and again over the same facts (ClickHouse keeps the recycled
// accounts' registration rows), three times one after the other and twice
// at once, while a local pool hands the recycled uins out. The uins were
// recycled once: every later grant for the same registration is refused,
// no deletion clears the bits of a uin that is pooled, leased or handed
// out, and every uin is handed out exactly once.
func TestReclassifyingHandsEveryUinOutOnce(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		s := newStack(t, b, rdb, app.Options{Policy: testPolicy(100 * time.Millisecond)})
		ns := s.Opts.Namespace
		ctx := context.Background()
		parts, err := streams.PartitionCount(ctx, b.Kafka, ns+schemas.TopicRecycleReqs)
		if err != nil {
			t.Fatal(err)
		}
		day := int64(24 * time.Hour / time.Millisecond)
		now := time.Now().UnixMilli()
		const first, n = 40_001, 300
		classify := func(from, to uint64, registeredAt int64) []*kgo.Record {
			return batchedGrants(t, ns+schemas.TopicRecycleReqs, parts, from, to, recycling.Inactive, now-400*day, registeredAt)
		}
		cl := streamstest.Client(t, b.Kafka)
		streamstest.ProduceSync(t, cl, classify(first, first+n-1, now-200*day)...)
		runCtx := start(t, s)
		steps(t, s, len(fullCycle)*n, 0) // recycled and pooled, once

		// A registration service takes uins from its local pool all along.
		alloc := pool.NewAllocator(s.Pool, "reg", pool.LowWater(20), pool.Chunk(40))
		allocCtx, stopAlloc := context.WithCancel(runCtx)
		defer stopAlloc()
		go func() { _ = alloc.Run(allocCtx) }()
		var mu sync.Mutex
		handed := map[uint32]int{}
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for allocCtx.Err() == nil {
				got, err := alloc.Allocate(allocCtx, 7)
				mu.Lock()
				for _, u := range got {
					handed[u]++
				}
				mu.Unlock()
				if errors.Is(err, pool.ErrExhausted) {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()

		// The classification again: three runs, then two at once.
		for range 3 {
			streamstest.ProduceSync(t, cl, classify(first, first+n-1, now-200*day)...)
			time.Sleep(150 * time.Millisecond) // longer than a ban: a wrongly granted ticket would be deleting by now
		}
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				streamstest.ProduceSync(t, cl, classify(first, first+n-1, now-200*day)...)
			}()
		}
		wg.Wait()
		// Fresh registrations on every partition after the re-runs: once
		// they are recycled, every re-run grant before them was judged.
		const fresh, m = 50_001, 64
		streamstest.ProduceSync(t, cl, classify(fresh, fresh+m-1, now-100*day)...)
		got := steps(t, s, len(fullCycle)*(n+m), 3*time.Second)
		for u := uint64(first); u < first+n; u++ {
			if k := kinds(got[u]); !slices.Equal(k, fullCycle) {
				t.Fatalf("uin %d recycled again: steps %v", u, k)
			}
		}

		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			total := len(handed)
			mu.Unlock()
			if total >= n+m || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Second) // a uin pooled twice would be handed out again meanwhile
		stopAlloc()
		<-drained
		mu.Lock()
		defer mu.Unlock()
		if len(handed) != n+m {
			t.Errorf("%d distinct uins handed out, want the %d recycled", len(handed), n+m)
		}
		for u, times := range handed {
			if times != 1 {
				t.Errorf("uin %d handed out %d times", u, times)
			}
			if (u < first || u >= first+n) && (u < fresh || u >= fresh+m) {
				t.Errorf("uin %d handed out, never recycled", u)
			}
		}
		if size, err := s.Pool.Size(ctx); err != nil || size != 0 {
			t.Errorf("central pool holds %d after the drain (%v)", size, err)
		}
	})
}
