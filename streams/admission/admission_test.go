package admission

import (
	"context"
	"net/http"
	"net/http/httptest"
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
	g := New(Config{MaxInFlight: 2, MaxQueue: 2, Timeout: 500 * time.Millisecond, Name: "test", Metrics: metrics.NewRegistry()})
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
	g.observe(time.Second) // requests have been taking a second each
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
