// Package admission keeps an HTTP service useful under overload and
// hostile clients: a bounded number of requests in flight and a bounded
// queue before them (Gate), and a server with timeouts and a connection
// limit (Serve).
//
// Overload must not turn into a queue of requests that die waiting: a
// request that cannot start before its client's deadline is refused at
// once with 503 and Retry-After, so the client retries elsewhere or later
// while the requests that were admitted are answered in time. A request
// whose client has gone while it waited is dropped before it costs any
// Redis or Kafka work.
package admission

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"surge/streams/metrics"
)

// Config bounds a Gate. Zero values take the defaults.
type Config struct {
	// MaxInFlight is how many requests are served at once (default 64
	// per CPU: the handlers wait on Redis and Kafka, not on the CPU).
	MaxInFlight int
	// MaxQueue is how many requests may wait for a slot (default 4 x
	// MaxInFlight); beyond it a request is refused at once.
	MaxQueue int
	// Timeout is a request's deadline when its client sends none
	// (Request-Timeout header, seconds or a Go duration); a client's
	// own deadline is capped by it. Default 2 s.
	Timeout time.Duration
	// RetryAfter is what a refused client is told to wait (default 1 s).
	RetryAfter time.Duration
	// Name labels the metrics (the service).
	Name    string
	Metrics *metrics.Registry
}

// HeaderTimeout is the request header in which a client says how long it
// will wait for the answer ("1.5" seconds, or "1500ms").
const HeaderTimeout = "Request-Timeout"

func (c *Config) defaults() {
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 64 * runtime.GOMAXPROCS(0)
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 4 * c.MaxInFlight
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = time.Second
	}
	if c.Metrics == nil {
		c.Metrics = metrics.Default
	}
}

// Gate admits requests to a handler.
type Gate struct {
	cfg    Config
	slots  chan struct{}
	queued atomic.Int64
	// serviceNs is a moving average of how long an admitted request
	// holds its slot: with the queue's length it estimates the wait.
	serviceNs atomic.Int64

	mRefused             metrics.CounterVec
	mAdmitted, mAbandons metrics.Counter
	mQueued, mInFlight   metrics.Gauge
}

// New returns a gate.
func New(cfg Config) *Gate {
	cfg.defaults()
	reg := cfg.Metrics
	g := &Gate{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight),
		mRefused:  reg.NewCounterVec("surge_http_refused_total", "requests refused by admission control", "service", "reason"),
		mAdmitted: reg.NewCounterVec("surge_http_admitted_total", "requests admitted by admission control", "service").With(cfg.Name),
		mAbandons: reg.NewCounterVec("surge_http_abandoned_total", "requests whose client left while they waited", "service").With(cfg.Name),
		mQueued:   reg.NewGaugeVec("surge_http_queued", "requests waiting for a slot", "service").With(cfg.Name),
		mInFlight: reg.NewGaugeVec("surge_http_in_flight", "requests being served", "service").With(cfg.Name),
	}
	return g
}

// Wrap puts the gate before next.
func (g *Gate) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.admit(w, r) {
			return
		}
		g.mInFlight.Add(1)
		start := time.Now()
		defer func() {
			g.observe(time.Since(start))
			g.mInFlight.Add(-1)
			<-g.slots
		}()
		next.ServeHTTP(w, r)
	})
}

// admit takes a slot for r, or answers it and returns false.
func (g *Gate) admit(w http.ResponseWriter, r *http.Request) bool {
	select {
	case g.slots <- struct{}{}:
		g.mAdmitted.Inc()
		return true
	default:
	}
	budget := g.deadline(r) - time.Duration(g.serviceNs.Load())
	waiting := g.queued.Add(1)
	defer func() { g.queued.Add(-1); g.mQueued.Set(float64(g.queued.Load())) }()
	g.mQueued.Set(float64(waiting))
	switch {
	case waiting > int64(g.cfg.MaxQueue):
		g.refuse(w, "queue_full", "the queue is full")
		return false
	case budget <= 0 || g.expectedWait(waiting) > budget:
		g.refuse(w, "would_miss_deadline", "it could not start before its deadline")
		return false
	}
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		if r.Context().Err() != nil { // the client left while it waited
			<-g.slots
			g.mAbandons.Inc()
			return false
		}
		g.mAdmitted.Inc()
		return true
	case <-t.C:
		g.refuse(w, "deadline", "it waited until its deadline")
		return false
	case <-r.Context().Done():
		g.mAbandons.Inc()
		return false
	}
}

// deadline is how long r's client waits: its Request-Timeout, capped by
// the configured one.
func (g *Gate) deadline(r *http.Request) time.Duration {
	raw := r.Header.Get(HeaderTimeout)
	if raw == "" {
		return g.cfg.Timeout
	}
	d, err := time.ParseDuration(raw)
	if err != nil {
		secs, ferr := strconv.ParseFloat(raw, 64)
		if ferr != nil || secs <= 0 || secs > 3600 {
			return g.cfg.Timeout
		}
		d = time.Duration(secs * float64(time.Second))
	}
	return min(max(d, 0), g.cfg.Timeout)
}

// expectedWait estimates the wait of the request waiting-th in line.
func (g *Gate) expectedWait(waiting int64) time.Duration {
	per := time.Duration(g.serviceNs.Load())
	return time.Duration(waiting) * per / time.Duration(g.cfg.MaxInFlight)
}

// observe folds one service time into the moving average (weight 1/16).
func (g *Gate) observe(d time.Duration) {
	for {
		old := g.serviceNs.Load()
		next := old + (int64(d)-old)/16
		if old == 0 {
			next = int64(d)
		}
		if g.serviceNs.CompareAndSwap(old, next) {
			return
		}
	}
}

func (g *Gate) refuse(w http.ResponseWriter, reason, why string) {
	g.mRefused.With(g.cfg.Name, reason).Inc()
	w.Header().Set("Retry-After", strconv.Itoa(max(int(g.cfg.RetryAfter/time.Second), 1)))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf("overloaded: request refused because %s; retry after %s", why, g.cfg.RetryAfter)})
}
