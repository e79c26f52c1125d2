package allocation_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/platform/apikey"
	"surge/processors/uin/account"
	"surge/processors/uin/allocation"
	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/streams"
	"surge/streams/admission"
	"surge/streams/streamstest"
)

// countingTransport counts the HTTP calls the client makes.
type countingTransport struct {
	calls atomic.Int64
	rt    http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.calls.Add(1)
	return c.rt.RoundTrip(r)
}

// startPool runs a pool service over a central pool holding size uins.
func startPool(t *testing.T, b streamstest.Backend, rdb *redis.Client, size int) (url, key string) {
	t.Helper()
	url, key, _ = startPoolWith(t, b, rdb, size, pool.LowWater(200), pool.Chunk(400))
	return url, key
}

// startPoolWith is startPool with the local pool's options, returning the
// central pool too.
func startPoolWith(t *testing.T, b streamstest.Backend, rdb *redis.Client, size int, local ...pool.AllocatorOption) (url, key string, central *pool.Central) {
	t.Helper()
	// These tests are about the pool, not admission control: a burst
	// waiting on a refill is served, whatever a slow machine's scheduling
	// does to the gate's 100 ms target and wait.
	return startPoolGated(t, b, rdb, size, admission.Config{TargetLatency: 5 * time.Second, MaxWait: 5 * time.Second, Timeout: 10 * time.Second}, local...)
}

// startPoolGated is startPoolWith behind the given admission control.
func startPoolGated(t *testing.T, b streamstest.Backend, rdb *redis.Client, size int, gate admission.Config, local ...pool.AllocatorOption) (url, key string, central *pool.Central) {
	t.Helper()
	ctx := context.Background()
	ns := streamstest.Unique("alloc") + "."
	streamstest.CreateTopics(t, b.Kafka, 1, ns+schemas.TopicPool, ns+schemas.TopicDeadLetter)
	journal := pool.NewKafkaJournal(b.Kafka, ns+schemas.TopicPool, 10)
	t.Cleanup(journal.Close)
	central = pool.NewCentral(rdb, uinkeys.Pool(ns), 10).WithJournal(journal)
	if _, err := central.Rebuild(ctx, b.Kafka, ns+schemas.TopicPool, pool.RebuildOptions{}); err != nil { // a new, empty pool
		t.Fatal(err)
	}
	uins := make([]uint32, size)
	for i := range uins {
		uins[i] = uint32(1_000_000 + i)
	}
	if _, err := central.Insert(ctx, uins); err != nil {
		t.Fatal(err)
	}
	keys, secret := apikey.Generate("test")
	svc := allocation.New(allocation.Config{
		Env:      streams.Env{Kafka: b.Kafka, Namespace: ns, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Instance: "t", Addr: "127.0.0.1:0", Keys: keys,
		Local:   local,
		Central: central, Accounts: account.NewStore(rdb, uinkeys.Prefix(ns)),
		Admission: gate})
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("uin-pool: %v", err)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); svc.Addr() == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("uin-pool did not listen")
		}
	}
	return "http://" + svc.Addr(), secret, central
}

// Concurrent callers of one Client each get their own uin, never one
// twice, in far fewer HTTP calls than uins; when the pool runs dry every
// caller beyond it is told so, and nobody gets a uin twice.
func TestClientBatchesConcurrentCallers(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		const size, callers, each = 5000, 64, 100 // 6400 asked of 5000
		url, key := startPool(t, b, rdb, size)
		ct := &countingTransport{rt: &http.Transport{MaxIdleConnsPerHost: 4}}
		cl := allocation.NewClient(url, key, allocation.InFlight(4), allocation.HTTPClient(&http.Client{Transport: ct}))
		var (
			mu   sync.Mutex
			got  = map[uint32]int{}
			dry  atomic.Int64
			errs = map[string]int{}
			wg   sync.WaitGroup
		)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					u, err := cl.Allocate(ctx)
					mu.Lock()
					switch {
					case errors.Is(err, allocation.ErrPoolDry):
						dry.Add(1)
					case err != nil:
						errs[err.Error()]++
					default:
						got[u]++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("errors: %v", errs)
		}
		for u, n := range got {
			if n > 1 {
				t.Fatalf("uin %d handed out %d times", u, n)
			}
			if u < 1_000_000 || u >= 1_000_000+size {
				t.Fatalf("uin %d was never in the pool", u)
			}
		}
		if len(got) != size || int(dry.Load()) != callers*each-size {
			t.Fatalf("%d uins handed out and %d told the pool is dry; want %d and %d", len(got), dry.Load(), size, callers*each-size)
		}
		calls := ct.calls.Load()
		t.Logf("%d allocations in %d HTTP calls", callers*each, calls)
		if calls*4 > callers*each {
			t.Fatalf("%d HTTP calls for %d allocations: concurrent callers were not served together", calls, callers*each)
		}
	})
}

// A lone caller is not held back waiting for company: each Allocate is
// one HTTP call of one uin.
func TestClientLoneCallerGoesAtOnce(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		url, key := startPool(t, b, rdb, 100)
		ct := &countingTransport{rt: http.DefaultTransport}
		cl := allocation.NewClient(url, key, allocation.HTTPClient(&http.Client{Transport: ct}))
		seen := map[uint32]bool{}
		for i := range 20 {
			u, err := cl.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if seen[u] {
				t.Fatalf("uin %d twice", u)
			}
			seen[u] = true
			if n := ct.calls.Load(); n != int64(i+1) {
				t.Fatalf("after %d allocations %d HTTP calls", i+1, n)
			}
		}
		bad := allocation.NewClient(url, "wrong-key")
		if _, err := bad.Allocate(context.Background()); err == nil || errors.Is(err, allocation.ErrPoolDry) {
			t.Fatalf("a wrong key got %v, want the service's refusal", err)
		} else {
			t.Logf("wrong key: %v", err)
		}
	})
}
