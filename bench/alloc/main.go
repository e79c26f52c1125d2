// Command alloc measures the uin-pool allocation API: one client process
// with C concurrent connections calling POST /v1/uins for D, against a
// pool service (in this process unless -url) on redis-server. It reports
// allocations per second and the latency percentiles of a call, and
// checks that no uin was handed out twice.
//
//	go run ./bench/alloc -redis 127.0.0.1:16379 -conns 32 -count 1 -for 10s
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/platform/apikey"
	"surge/processors/uin/account"
	"surge/processors/uin/allocation"
	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/streams"
	"surge/streams/embedded"
)

func main() {
	redisAddr := flag.String("redis", "127.0.0.1:16379", "redis-server")
	brokers := flag.String("brokers", "", "real broker(s) for uin.pool, the pool's journal; empty starts kfake in process")
	conns := flag.Int("conns", 32, "concurrent connections of the one client")
	count := flag.Int("count", 1, "uins per call")
	dur := flag.Duration("for", 10*time.Second, "how long to call")
	seed := flag.Int("seed", 2_000_000, "uins put into the central pool first")
	h2c := flag.Bool("h2c", false, "call over cleartext HTTP/2 (one multiplexed connection) instead of HTTP/1.1")
	local := flag.Int("local", 2000, "uins the service keeps leased locally (uin.pool_local; a refill pulls twice this)")
	useClient := flag.Bool("client", false, "callers share one allocation.Client (one uin per Allocate; concurrent callers served by one call)")
	inFlight := flag.Int("inflight", 2, "with -client: calls on the wire at once")
	cpuProfile := flag.String("cpuprofile", "", "CPU profile of the run (service and client)")
	flag.Parse()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64})
	defer rdb.Close()
	kc, backend, stopKafka, err := embedded.KafkaOr(*brokers)
	must(err)
	defer stopKafka()
	ns := fmt.Sprintf("abench%d.", time.Now().UnixNano())
	// Every allocation is journaled on uin.pool before it is answered.
	cl, err := kc.NewClient()
	must(err)
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, schemas.Namespaced(ns, schemas.TopicPool, schemas.TopicDeadLetter)...))
	cl.Close()
	journal := pool.NewKafkaJournal(kc, ns+schemas.TopicPool, 1000)
	defer journal.Close()
	central := pool.NewCentral(rdb, uinkeys.Pool(ns), 1000).WithJournal(journal)
	_, err = central.Rebuild(ctx, kc, ns+schemas.TopicPool, pool.RebuildOptions{}) // a new pool
	must(err)
	fmt.Printf("uin.pool on %s\n", backend)
	batch := make([]uint32, 0, 100_000)
	for u := 1; u <= *seed; u++ {
		if batch = append(batch, uint32(10_000_000+u)); len(batch) == cap(batch) || u == *seed {
			_, err := central.Insert(ctx, batch)
			must(err)
			batch = batch[:0]
		}
	}
	keys, secret := apikey.Generate("bench")
	svc := allocation.New(allocation.Config{
		Env:      streams.Env{Kafka: kc, Namespace: ns, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Instance: "bench", Addr: "127.0.0.1:0", Keys: keys,
		Local:   []pool.AllocatorOption{pool.LowWater(*local), pool.Chunk(2 * *local)},
		Central: central, Accounts: account.NewStore(rdb, uinkeys.Prefix(ns))})
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(sctx) }()
	for svc.Addr() == "" || svc.Allocator().Held() < *local {
		time.Sleep(10 * time.Millisecond)
	}
	url := fmt.Sprintf("http://%s/v1/uins?count=%d", svc.Addr(), *count)
	if *useClient {
		fmt.Printf("redis %s; %d cores, %s; central pool %d uins; %d concurrent callers of one allocation.Client (%d calls in flight), 1 uin per Allocate, %s\n",
			*redisAddr, runtime.NumCPU(), runtime.Version(), *seed, *conns, *inFlight, *dur)
	} else {
		fmt.Printf("redis %s; %d cores, %s; central pool %d uins; %d concurrent callers (h2c %v), %d uin(s) per call, %s\n",
			*redisAddr, runtime.NumCPU(), runtime.Version(), *seed, *conns, *h2c, *count, *dur)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	tr := &http.Transport{MaxIdleConnsPerHost: *conns, MaxConnsPerHost: *conns}
	if *h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	hc := &http.Client{Transport: tr}
	counting := &countingTransport{rt: &http.Transport{MaxIdleConnsPerHost: *inFlight, MaxConnsPerHost: *inFlight}}
	client := allocation.NewClient("http://"+svc.Addr(), secret, allocation.InFlight(*inFlight),
		allocation.HTTPClient(&http.Client{Transport: counting}))
	var (
		mu       sync.Mutex
		lat      []time.Duration
		seen     = make(map[uint32]struct{}, 1<<20)
		dups     atomic.Int64
		failures atomic.Int64
		wg       sync.WaitGroup
	)
	end := time.Now().Add(*dur)
	start := time.Now()
	for range *conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			var got []uint32
			for *useClient && time.Now().Before(end) {
				t0 := time.Now()
				u, err := client.Allocate(ctx)
				if err != nil {
					failures.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
				got = append(got, u)
			}
			for !*useClient && time.Now().Before(end) {
				req, _ := http.NewRequest("POST", url, nil)
				req.Header.Set("Authorization", "Bearer "+secret)
				t0 := time.Now()
				resp, err := hc.Do(req)
				if err != nil {
					failures.Add(1)
					continue
				}
				var body struct {
					Uins []uint32 `json:"uins"`
				}
				err = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					failures.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
				got = append(got, body.Uins...)
			}
			mu.Lock()
			lat = append(lat, mine...)
			for _, u := range got {
				if _, dup := seen[u]; dup {
					dups.Add(1)
				}
				seen[u] = struct{}{}
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	stop()
	must(<-done)
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(time.Microsecond)
	}
	fmt.Printf("calls: %d in %s = %.0f calls/s; %d uins = %.0f allocs/s; %d failed calls\n",
		len(lat), took.Round(time.Millisecond), float64(len(lat))/took.Seconds(), len(seen), float64(len(seen))/took.Seconds(), failures.Load())
	if *useClient {
		fmt.Printf("(each call above is one Allocate; the client made %d HTTP calls, %.1f uins each)\n",
			counting.calls.Load(), float64(len(lat))/float64(max(counting.calls.Load(), 1)))
	}
	fmt.Printf("latency per call: p50 %s  p99 %s  p99.9 %s  max %s\n", pct(0.50), pct(0.99), pct(0.999), pct(1))
	if dups.Load() > 0 {
		fmt.Printf("FAIL: %d uins handed out twice\n", dups.Load())
		os.Exit(1)
	}
	fmt.Println("check: no uin handed out twice")
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// countingTransport counts the HTTP calls of the -client run.
type countingTransport struct {
	calls atomic.Int64
	rt    http.RoundTripper
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.calls.Add(1)
	return c.rt.RoundTrip(r)
}
