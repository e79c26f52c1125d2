package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/bench/internal/proccpu"
	"surge/processors/wallet/api"
	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/ledger"
	"surge/streams"
)

// httpBench drives the wallet's HTTP API on loopback, as the activity
// services and the users' apps call it, with authentication on (signed
// grants, user tokens) and off (the same server without keys).
type httpBench struct {
	ns      string
	in      *grant.Intake
	batcher *grant.Batcher
	led     *ledger.Ledger
	cl      *kgo.Client
	rdb     *redis.Client
	src     *config.Source
	log     *slog.Logger
	workers int
	users   int
	watch   []proccpu.Watched
	// callerCPUs pins the callers' process (taskset -c), for runs with
	// the wallet process on cores of its own.
	callerCPUs string

	app     auth.Key
	userSet *auth.Users
	srv     [2]*http.Server // [0] auth off, [1] auth on
	url     [2]string
	hc      *http.Client
	run     int // distinct order numbers per run
}

func (h *httpBench) start() {
	h.app = auth.Key{ID: "bench-1", App: "bench", Secret: []byte(auth.NewSecret())}
	h.userSet = auth.NewUsers([]auth.Key{{ID: "u-1", Secret: []byte(auth.NewSecret())}})
	for i, on := range []bool{false, true} {
		cfg := api.Config{Env: streams.Env{Namespace: h.ns, Log: h.log}, Intake: h.in, Batcher: h.batcher, Ledger: h.led,
			Producer: h.cl, Redis: h.rdb, Source: h.src}
		if on {
			cfg.Apps, cfg.Users = auth.NewApps([]auth.Key{h.app}), h.userSet
		}
		s := api.New(cfg)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		must(err)
		h.srv[i] = &http.Server{Handler: s.Handler()}
		go func() { _ = h.srv[i].Serve(ln) }()
		h.url[i] = "http://" + ln.Addr().String()
	}
	h.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: h.workers, MaxConnsPerHost: h.workers}}
}

func (h *httpBench) close() {
	for _, s := range h.srv {
		_ = s.Close()
	}
}

func label(on bool) string {
	if on {
		return "auth on "
	}
	return "auth off"
}

// do sends one request and fails the run on anything but 200.
func (h *httpBench) do(req *http.Request) []byte {
	resp, err := h.hc.Do(req)
	must(err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		must(fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, body))
	}
	return body
}

// parallel runs n calls of fn on h.workers callers and returns their
// latencies, sorted, and the wall time.
func (h *httpBench) parallel(n int, fn func(i int)) ([]time.Duration, time.Duration) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range h.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				t0 := time.Now()
				fn(i)
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	return lat, el
}

func pct(lat []time.Duration, p int) time.Duration {
	return lat[len(lat)*p/100].Round(time.Microsecond)
}

// grants posts n grants, size per request (1: POST /v1/grants, more:
// POST /v1/grants/batch), signed when on.
func (h *httpBench) grants(on bool, size, n int) {
	h.run++
	grantJSON := func(k int) string {
		act := fmt.Sprintf("h%d", k%h.users)
		return fmt.Sprintf(`{"orderNo":"%s_rain_h%d-%d_1_1","actId":"%s","activityId":"spring","sceneId":"rain","rainId":"h%d-%d","awardType":"CASH","stage":1,"amount":%d,"appId":"bench"}`,
			act, h.run, k, act, h.run, k, 1+k%100)
	}
	reqs := (n + size - 1) / size
	bodies := make([][]byte, reqs) // made before the clock starts
	path := "/v1/grants"
	for r := range bodies {
		if size == 1 {
			bodies[r] = []byte(grantJSON(r))
			continue
		}
		path = "/v1/grants/batch"
		var parts []string
		for k := r * size; k < min(n, (r+1)*size); k++ {
			parts = append(parts, grantJSON(k))
		}
		bodies[r] = []byte(`{"grants":[` + strings.Join(parts, ",") + `]}`)
	}
	// A batch is many callers' grants: a few times as many in flight as
	// with single grants (the Batcher's batches fill), not size times more.
	callers := h.workers
	if size > 1 {
		callers = max(1, 4*h.workers/size)
	}
	h.post(on, path, size, n, callers, bodies, func(r int, body []byte) {
		if size > 1 && bytes.Count(body, []byte(`"code":200`)) != bytes.Count(bodies[r], []byte(`"orderNo"`)) {
			must(fmt.Errorf("batch not all granted: %.300s", body))
		}
	})
}

// reads gets n balances through GET /v1/users/{act}/balance, each with a
// fresh user token when on (the token's check is part of the read).
func (h *httpBench) reads(on bool, readers, n, backlogUsers int) {
	url, _ := h.target(on)
	w := h.workers
	h.workers = readers
	defer func() { h.workers = w }()
	toks := make([]string, backlogUsers)
	if on {
		for u := range toks {
			t, err := h.userSet.Issue(fmt.Sprintf("b%d", u), time.Hour, time.Now())
			must(err)
			toks[u] = t
		}
	}
	lat, el := h.parallel(n, func(k int) {
		u := k % backlogUsers
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/users/b%d/balance", url, u), nil)
		if on {
			req.Header.Set("Authorization", "Bearer "+toks[u])
		}
		h.do(req)
	})
	fmt.Printf("HTTP balance reads, %s, %d readers: %d reads in %v = %.0f/s, p50 %v, p99 %v\n",
		label(on), readers, n, el.Round(time.Millisecond), float64(n)/el.Seconds(), pct(lat, 50), pct(lat, 99))
}

// grantsProto posts n grants in batches of size as protobuf (GrantBatch,
// answered with GrantResults), signed when on. Its callers run in another
// process (callers.go): the figures are the wallet process's own.
// It returns the rate and the wallet process's CPU per grant.
func (h *httpBench) grantsProto(on bool, size, n, callers int) (perSec float64, walletCPU time.Duration) {
	h.run++
	url, key := h.target(on)
	job := callerJob{URL: url, Key: key, Path: "/v1/grants/batch", Run: h.run, Size: size, N: n, Callers: callers, Users: h.users, CPUs: h.callerCPUs}
	var cpu0, cpu time.Duration
	var others *proccpu.Span
	var othersUsed string
	res := runCallers(job, func() { cpu0, others = cpuTime(), proccpu.Start(h.watch) }, func() {
		cpu, othersUsed = cpuTime()-cpu0, others.Report(n, "grant")
	})
	if res.Err != "" {
		must(fmt.Errorf("callers: %s", res.Err))
	}
	el := res.Elapsed
	perSec, walletCPU = float64(n)/el.Seconds(), cpu/time.Duration(n)
	fmt.Printf("HTTP grants, %s, %4d per request (/v1/grants/batch, protobuf), %d callers in another process: %d grants in %v = %.0f grants/s, request p50 %v, p99 %v; wallet process CPU %.2f cores = %.2fµs/grant\n",
		label(on), size, callers, n, el.Round(time.Millisecond), perSec, res.P50, res.P99,
		cpu.Seconds()/el.Seconds(), float64(cpu.Microseconds())/float64(n))
	used := fmt.Sprintf("callers %.2f cores %.2fµs/grant", res.CPU.Seconds()/el.Seconds(), float64(res.CPU.Microseconds())/float64(n))
	if othersUsed != "" {
		used += ", " + othersUsed
	}
	fmt.Printf("  other processes meanwhile: %s\n", used)
	return perSec, walletCPU
}

// target is the server for runs with authentication on or off, and the
// key to sign with (nil: off).
func (h *httpBench) target(on bool) (url string, key *auth.Key) {
	if on {
		return h.url[1], &h.app
	}
	return h.url[0], nil
}

// median of a few measurements.
func median[T float64 | time.Duration](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// send posts the bodies from callers at once to url+path, signed with key
// when not nil, checks each answer, and returns the requests' latencies
// (sorted) and the wall time. contentType is set when not "".
func (h *httpBench) send(url, path, contentType string, key *auth.Key, callers int, bodies [][]byte, check func(r int, body []byte)) ([]time.Duration, time.Duration) {
	w := h.workers
	h.workers = callers
	defer func() { h.workers = w }()
	return h.parallel(len(bodies), func(r int) {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", url+path, bytes.NewReader(bodies[r]))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if key != nil {
			auth.Sign(req, bodies[r], *key, time.Now())
		}
		check(r, h.do(req))
	})
}

// post sends the bodies (n grants, size each) from callers at once to
// path on the API, signed when on, checks each answer, and prints the
// rate.
func (h *httpBench) post(on bool, path string, size, n, callers int, bodies [][]byte, check func(r int, body []byte)) {
	url, key := h.target(on)
	cpu0 := cpuTime()
	others := proccpu.Start(h.watch)
	lat, el := h.send(url, path, "", key, callers, bodies, check)
	cpu := cpuTime() - cpu0
	fmt.Printf("HTTP grants, %s, %4d per request (%s), %d callers: %d grants in %v = %.0f grants/s, request p50 %v, p99 %v; process CPU %.2f cores (server and callers)\n",
		label(on), size, path, callers, n, el.Round(time.Millisecond), float64(n)/el.Seconds(), pct(lat, 50), pct(lat, 99), cpu.Seconds()/el.Seconds())
	if r := others.Report(n, "grant"); r != "" {
		fmt.Printf("  this process %.2fµs/grant; other processes meanwhile: %s\n", float64(cpu.Microseconds())/float64(n), r)
	}
}
