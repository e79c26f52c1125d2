package admission

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"surge/streams/metrics"
)

// gated is a handler that holds every request until release is closed.
type gated struct {
	started atomic.Int64
	release chan struct{}
}

func (g *gated) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.started.Add(1)
	<-g.release
	w.WriteHeader(http.StatusOK)
}

func get(t *testing.T, url string, ctx context.Context, header map[string]string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// TestGateBoundsWorkAndRefusesEarly: two requests in flight and two
// queued; the fifth is refused at once (the queue is full), a queued one
// that cannot start before its deadline is refused with 503 and
// Retry-After, a client that leaves while queued costs the handler
// nothing, and once the load is gone requests are served again.
func TestGateBoundsWorkAndRefusesEarly(t *testing.T) {
	h := &gated{release: make(chan struct{})}
	g := New(Config{MaxInFlight: 2, MaxQueue: 2, Timeout: time.Second, MaxWait: time.Second, Name: "test", Metrics: metrics.NewRegistry()})
	srv := httptest.NewServer(g.Wrap(h))
	defer srv.Close()
	ctx := context.Background()

	var wg sync.WaitGroup
	codes := make(chan int, 4)
	for range 2 { // in flight, held
		wg.Add(1)
		go func() { defer wg.Done(); c, _ := get(t, srv.URL, ctx, nil); codes <- c }()
	}
	for h.started.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	// A client that leaves while queued: never reaches the handler.
	leaving, leave := context.WithCancel(ctx)
	wg.Add(1)
	go func() { defer wg.Done(); get(t, srv.URL, leaving, nil) }()
	for g.queued.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	leave()
	for g.queued.Load() != 0 { // it has gone from the queue
		time.Sleep(time.Millisecond)
	}
	// Two queued with the whole deadline: they wait.
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); c, _ := get(t, srv.URL, ctx, nil); codes <- c }()
	}
	for g.queued.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	// The queue is full: refused at once, while the queued two still wait.
	code, hdr := get(t, srv.URL, ctx, nil)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("request past a full queue: %d (Retry-After %q)", code, hdr.Get("Retry-After"))
	}
	if len(codes) != 0 {
		t.Fatal("the full-queue refusal came after the queued requests' deadline: it waited")
	}
	// The queued two reach their deadline while the handler holds.
	for range 2 {
		if c := <-codes; c != http.StatusServiceUnavailable {
			t.Fatalf("queued request past its deadline: %d, want 503", c)
		}
	}
	close(h.release)
	for range 2 {
		if c := <-codes; c != http.StatusOK {
			t.Fatalf("request in flight: %d, want 200", c)
		}
	}
	wg.Wait()
	if n := h.started.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want only the 2 admitted", n)
	}
	for range 3 {
		if c, _ := get(t, srv.URL, ctx, nil); c != http.StatusOK {
			t.Fatalf("after the load: %d", c)
		}
	}
}

// TestClientDeadlineIsHonoured: a client that says it waits 50 ms is
// refused at once when requests take longer than that to start.
func TestClientDeadlineIsHonoured(t *testing.T) {
	h := &gated{release: make(chan struct{})}
	g := New(Config{MaxInFlight: 1, MaxQueue: 10, Timeout: 5 * time.Second, Name: "test", Metrics: metrics.NewRegistry()})
	g.slots.smoothedNs = float64(time.Second) // requests have been taking a second each
	srv := httptest.NewServer(g.Wrap(h))
	defer srv.Close()
	done := make(chan struct{})
	go func() { defer close(done); get(t, srv.URL, context.Background(), nil) }()
	for h.started.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	for _, timeout := range []string{"0.05", "50ms"} {
		code, _ := get(t, srv.URL, context.Background(), map[string]string{HeaderTimeout: timeout})
		if code != http.StatusServiceUnavailable {
			t.Fatalf("Request-Timeout %s behind a one-second request: %d, want 503", timeout, code)
		}
	}
	// Refused on the estimate, before waiting in the queue at all.
	if n := g.mRefused.With("test", "would_miss_deadline").Value(); n != 2 {
		t.Fatalf("%v refusals on the estimate, want 2", n)
	}
	close(h.release)
	<-done
}

// TestSlowBodiesHoldNoSlot: with one slot, requests whose bodies stall
// do not keep a request without a body from being served; a body that
// completes while the slot is busy past MaxWait is answered 503 by the
// gate, and the handler's own answer is dropped; once the slot is free, a
// finished body is admitted and its handler runs.
func TestSlowBodiesHoldNoSlot(t *testing.T) {
	var worked atomic.Int64
	hold := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" {
			if r.URL.Path == "/hold" {
				<-hold
			}
			w.WriteHeader(http.StatusOK)
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusBadRequest) // dropped when the gate refused
			return
		}
		worked.Add(1)
		w.WriteHeader(http.StatusAccepted)
	})
	g := New(Config{MaxInFlight: 1, MaxQueue: 4, MaxWait: 50 * time.Millisecond, Name: "test", Metrics: metrics.NewRegistry()})
	srv := httptest.NewServer(g.Wrap(h))
	defer srv.Close()

	// Five stalled bodies: each sent its headers and part of its body.
	var writers []*io.PipeWriter
	for range 5 {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		req, _ := http.NewRequest("POST", srv.URL+"/post", pr)
		req.ContentLength = 10
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		go func() { _, _ = pw.Write([]byte("12345")) }()
	}
	time.Sleep(100 * time.Millisecond)
	if code, _ := get(t, srv.URL+"/get", context.Background(), nil); code != http.StatusOK {
		t.Fatalf("a request without a body, five bodies stalled on one slot: %d", code)
	}
	for _, pw := range writers {
		_ = pw.CloseWithError(io.ErrUnexpectedEOF)
	}

	// The slot busy: a complete body is refused by the gate after MaxWait.
	go func() { _, _ = get(t, srv.URL+"/hold", context.Background(), nil) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	resp, err := http.Post(srv.URL+"/post", "text/plain", strings.NewReader("0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a body done while the slot is busy: %d, want 503 with Retry-After", resp.StatusCode)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refused after %s (MaxWait 50 ms)", took)
	}
	close(hold)
	time.Sleep(20 * time.Millisecond)
	resp, err = http.Post(srv.URL+"/post", "text/plain", strings.NewReader("0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || worked.Load() != 1 {
		t.Fatalf("a body with the slot free: %d, %d handled (want 202, 1)", resp.StatusCode, worked.Load())
	}
}

// TestExcusedWaitsDoNotShrinkTheGate: requests that spend 150 ms waiting on
// something the handler excuses (a refill its caller chose to wait for)
// leave the gate at its limit, where the same requests unexcused cut it
// to its floor: the target steers by the service's own work only.
func TestExcusedWaitsDoNotShrinkTheGate(t *testing.T) {
	limitAfter := func(excuse bool) int {
		// The wait is excused as measured, as the allocator does: on a
		// loaded machine a 150 ms sleep takes longer, and excusing only
		// 150 ms left the rest over the target (CI cut the limit to 29).
		// The target leaves room for the scheduling around the handler.
		g := New(Config{MaxInFlight: 40, TargetLatency: 50 * time.Millisecond, Metrics: metrics.NewRegistry()})
		h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			began := time.Now()
			time.Sleep(150 * time.Millisecond)
			if excuse {
				Excuse(r.Context(), time.Since(began))
			}
			w.WriteHeader(http.StatusOK)
		}))
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 15 {
					g.slots.mu.Lock()
					g.slots.lastCut = time.Time{} // as if the last cut was long ago
					g.slots.mu.Unlock()
					w := httptest.NewRecorder()
					h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
				}
			}()
		}
		wg.Wait()
		limit, _ := g.slots.state()
		return limit
	}
	if got := limitAfter(false); got != 8 {
		t.Fatalf("unexcused 150 ms requests against a 50 ms target: limit %d, want the floor 8", got)
	}
	if got := limitAfter(true); got != 40 {
		t.Fatalf("excused 150 ms waits: limit %d, want it left at 40", got)
	}
}

// A request refused once its body has arrived is counted in the request
// metrics as the 503 its client got, not as the 400 the handler writes
// when the gate cuts its read short.
func TestRefusalsCountedAsTheClientSawThem(t *testing.T) {
	reg := metrics.NewRegistry()
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		<-release
	})
	g := New(Config{MaxInFlight: 1, MaxQueue: 1, Timeout: time.Second, MaxWait: 10 * time.Millisecond, Name: "test", Metrics: reg})
	srv := httptest.NewServer(g.Instrumented("test", h))
	defer srv.Close()
	post := func() int {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"a":1}`))
		if err != nil {
			t.Error(err)
			return 0
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	held := make(chan int, 1)
	go func() { held <- post() }()
	for g.slots.tryAcquire() { // wait for the first request to hold the only slot
		g.slots.giveBack()
		time.Sleep(time.Millisecond)
	}
	if code := post(); code != http.StatusServiceUnavailable {
		t.Fatalf("second request: %d, want 503", code)
	}
	close(release)
	if code := <-held; code != http.StatusOK {
		t.Fatalf("first request: %d", code)
	}
	seen := reg.NewHistogramVec("surge_http_request_duration_seconds", "", metrics.LatencyBuckets, "api", "method", "code")
	if n := seen.With("test", "POST", "503").Count(); n != 1 {
		t.Errorf("refusals counted as 503: %d, want 1", n)
	}
	if n := seen.With("test", "POST", "400").Count(); n != 0 {
		t.Errorf("refusals counted as 400: %d, want 0", n)
	}
	if n := seen.With("test", "POST", "200").Count(); n != 1 {
		t.Errorf("served: %d, want 1", n)
	}
}
