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
// Redis or Kafka work. A request with a body takes its slot only once its
// body has arrived: a client that sends its body slowly, or stalls, holds
// a connection (bounded by the server's limits), never a slot.
package admission

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"surge/streams/httperr"
	"surge/streams/metrics"
)

// Config bounds a Gate. Zero values take the defaults.
type Config struct {
	// MaxInFlight is the most requests served at once (default 64 per
	// CPU: the handlers wait on Redis and Kafka, not on the CPU). The gate
	// serves fewer while admitted requests take longer than
	// TargetLatency (see limiter).
	MaxInFlight int
	// TargetLatency is how long an admitted request should take (default
	// 25 ms): above it the number in flight shrinks, below it grows. At
	// 100 ms the wallet's admitted p99 at 4x its capacity was 310 ms
	// against 107 ms at 25 ms, for about a fifth less goodput
	// (bench/overload-ab.txt).
	TargetLatency time.Duration
	// MaxQueue is how many requests may wait for a slot (default 4 x
	// MaxInFlight); beyond it a request is refused at once.
	MaxQueue int
	// Timeout is a request's deadline when its client sends none
	// (Request-Timeout header, seconds or a Go duration); a client's
	// own deadline is capped by it. Default 2 s.
	Timeout time.Duration
	// MaxWait is the longest a request waits for a slot, whatever its
	// deadline (default 5 ms): a queue that takes longer to drain only
	// adds its wait to every answer, so a request that would wait longer
	// is refused at once instead, and a refusal comes within about this.
	MaxWait time.Duration
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
	if c.TargetLatency <= 0 {
		c.TargetLatency = 25 * time.Millisecond
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 5 * time.Millisecond
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
	slots  *limiter
	queued atomic.Int64

	mRefused             metrics.CounterVec
	mAdmitted, mAbandons metrics.Counter
	mQueued, mInFlight   metrics.Gauge
	mLimit               metrics.Gauge
}

// New returns a gate.
func New(cfg Config) *Gate {
	cfg.defaults()
	reg := cfg.Metrics
	g := &Gate{cfg: cfg, slots: newLimiter(cfg.MaxInFlight, cfg.TargetLatency),
		mLimit:    reg.NewGaugeVec("surge_http_limit", "requests the gate lets in flight now (adapted to the target latency)", "service").With(cfg.Name),
		mRefused:  reg.NewCounterVec("surge_http_refused_total", "requests refused by admission control", "service", "reason"),
		mAdmitted: reg.NewCounterVec("surge_http_admitted_total", "requests admitted by admission control", "service").With(cfg.Name),
		mAbandons: reg.NewCounterVec("surge_http_abandoned_total", "requests whose client left while they waited", "service").With(cfg.Name),
		mQueued:   reg.NewGaugeVec("surge_http_queued", "requests waiting for a slot", "service").With(cfg.Name),
		mInFlight: reg.NewGaugeVec("surge_http_in_flight", "requests being served", "service").With(cfg.Name),
	}
	return g
}

// Wrap puts the gate before next. A request without a body is admitted
// (or refused) before next sees it; one with a body when next has read
// all of it (see bodyGate), so reading a slow body holds no slot. A
// handler must read a body to its end before its work (io.ReadAll, not a
// json.Decoder that stops at the value's end).
func (g *Gate) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		excused := new(atomic.Int64)
		r = r.WithContext(context.WithValue(r.Context(), excuseKey{}, excused))
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			bg := &bodyGate{g: g, w: &gatedWriter{ResponseWriter: w}, r: r, body: r.Body, excused: excused}
			r.Body = bg
			defer bg.release()
			next.ServeHTTP(bg.w, r)
			return
		}
		if !g.admit(w, r) {
			return
		}
		defer g.hold(excused)()
		next.ServeHTTP(w, r)
	})
}

// Instrumented is Wrap with the request metrics (surge_http_request_
// duration_seconds{api}) outside the gate, so they count what the client
// got: a refusal as the 503 it was, not the 400 the handler wrote to a
// body read that the gate cut short, nor nothing at all.
func (g *Gate) Instrumented(api string, next http.Handler) http.Handler {
	return g.cfg.Metrics.InstrumentHTTP(api, g.Wrap(next))
}

type excuseKey struct{}

// Excuse tells the gate that d of the request in ctx was spent waiting on
// something that is not this service's load (the uin pool waiting for a
// refill its caller chose to wait for): the gate leaves it out of the
// latency it keeps at its target, so such waits neither shrink the
// concurrency it admits nor need a target long enough to hide them.
func Excuse(ctx context.Context, d time.Duration) {
	if ex, ok := ctx.Value(excuseKey{}).(*atomic.Int64); ok && d > 0 {
		ex.Add(int64(d))
	}
}

// hold counts an admitted request in flight and returns its release.
func (g *Gate) hold(excused *atomic.Int64) func() {
	g.mInFlight.Add(1)
	start := time.Now()
	return func() {
		g.mInFlight.Add(-1)
		g.slots.release(max(time.Since(start)-time.Duration(excused.Load()), 0))
		limit, _ := g.slots.state()
		g.mLimit.Set(float64(limit))
	}
}

// bodyGate is a request body that asks the gate for a slot when the
// handler has read it to its end: the work that needs the slot (Redis,
// Kafka) comes after. A handler that answers before the end (a refusal
// from the headers, a body too large) never takes one. Refused, the gate
// answers 503 itself and the read fails; the handler's own answer is
// dropped (gatedWriter).
type bodyGate struct {
	g        *Gate
	w        *gatedWriter
	r        *http.Request
	body     io.ReadCloser
	admitted func() // the slot's release, once admitted
	refused  bool
	excused  *atomic.Int64
}

var errOverloaded = errors.New("admission: overloaded, request refused (503 sent)")

func (b *bodyGate) Read(p []byte) (int, error) {
	if b.refused {
		return 0, errOverloaded
	}
	n, err := b.body.Read(p)
	if err == io.EOF && b.admitted == nil {
		if !b.g.admit(b.w.ResponseWriter, b.r) {
			b.refused, b.w.closed = true, true
			return n, errOverloaded
		}
		b.admitted = b.g.hold(b.excused)
	}
	return n, err
}

func (b *bodyGate) Close() error { return b.body.Close() }

func (b *bodyGate) release() {
	if b.admitted != nil {
		b.admitted()
	}
}

// gatedWriter drops what the handler writes after the gate answered.
type gatedWriter struct {
	http.ResponseWriter
	closed bool
}

func (w *gatedWriter) WriteHeader(code int) {
	if !w.closed {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	if w.closed {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *gatedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// admit takes a slot for r, or answers it and returns false.
func (g *Gate) admit(w http.ResponseWriter, r *http.Request) bool {
	if g.slots.tryAcquire() {
		g.mAdmitted.Inc()
		return true
	}
	limit, service := g.slots.state()
	budget := min(g.deadline(r)-service, g.cfg.MaxWait)
	waiting := g.queued.Add(1)
	defer func() { g.queued.Add(-1); g.mQueued.Set(float64(g.queued.Load())) }()
	g.mQueued.Set(float64(waiting))
	switch {
	case waiting > int64(g.cfg.MaxQueue):
		g.refuse(w, "queue_full", "the queue is full")
		return false
	case budget <= 0 || time.Duration(waiting)*service/time.Duration(max(limit, 1)) > budget:
		g.refuse(w, "would_miss_deadline", "it could not start in time")
		return false
	}
	ok, timedOut := g.slots.acquire(r.Context(), budget)
	switch {
	case ok && r.Context().Err() != nil: // the client left while it waited
		g.slots.giveBack()
		g.mAbandons.Inc()
		return false
	case ok:
		g.mAdmitted.Inc()
		return true
	case timedOut:
		g.refuse(w, "deadline", "it waited as long as it may")
		return false
	default:
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

func (g *Gate) refuse(w http.ResponseWriter, reason, why string) {
	g.mRefused.With(g.cfg.Name, reason).Inc()
	w.Header().Set("Retry-After", strconv.Itoa(max(int(g.cfg.RetryAfter/time.Second), 1)))
	httperr.Write(w, http.StatusServiceUnavailable, httperr.Overloaded, fmt.Sprintf("overloaded: request refused because %s; retry after %s", why, g.cfg.RetryAfter))
}
