// Package allocation is the uin-pool service: the allocation API a
// registration service calls for a new account number, backed by a local
// pool leased from the central pool in Redis (see pool.Allocator for why
// no uin is ever handed out twice, across instances and kill -9), and the
// consumer of uin.pool that takes back uins a registration gave up.
//
// API (every call needs "Authorization: Bearer <key>"):
//
//	POST /v1/uins?count=N   allocate N uins (1..1000, default 1)
//	                        200 {"uins":[...]}; 503 when the pool is dry
//	GET  /v1/pool           {"central":…, "leased":…, "local":…, "low":…}
//
// A release is a PoolChange{op: RELEASE} record on uin.pool, keyed by
// bucket (ReleaseRecord builds one), from the registration service:
// releases go through the topic so they are ordered, replayable and
// audited like every state change.
//
// uin.pool is the pool's source of truth (pool.Journal): every allocation
// is on it before it is answered. When Redis lost the pool (its generation
// marker is gone), allocations answer 503 while one instance folds the
// topic back into Redis (pool.Central.Rebuild), and then go on.
package allocation

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"surge/streams/openapi"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/platform/apikey"
	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/admission"
	"surge/streams/httperr"
	"surge/streams/metrics"
)

// Config configures the service.
type Config struct {
	streams.Env
	Instance string // this instance's name (its lease is kept under it)
	Addr     string // HTTP listen address
	Keys     *apikey.Keys
	LowWater int64 // central pool size under which the pool reports low
	Local    []pool.AllocatorOption
	Central  *pool.Central  // the central pool in Redis (required)
	Accounts *account.Store // who holds a uin, checked on release (required)
	// Admission bounds the requests in flight and queued (zero: the
	// defaults); Limits the server's timeouts and connections.
	Admission admission.Config
	Limits    admission.Limits
	// RebuildSettle is how long a rebuild of a lost pool waits for
	// changes made just before the loss (pool.RebuildOptions.Settle).
	RebuildSettle time.Duration
}

// commitMargin is how long a call may take beyond the allocator's refill
// wait: the commit of what it took to Redis and uin.pool.
const commitMargin = time.Second

// MaxCount is the most uins one call allocates.
const MaxCount = 1000

// Service is one uin-pool instance.
type Service struct {
	cfg      Config
	central  *pool.Central
	accounts *account.Store
	alloc    *pool.Allocator

	central0 atomic.Int64 // last central pool size seen
	leased   atomic.Int64
	low      atomic.Bool
	listener atomic.Pointer[net.Listener]
	// keeper rebuilds the pool from uin.pool when Redis lost it;
	// allocations answer 503 until it is there.
	keeper *pool.Keeper

	allocated, released, refused, givenBack metrics.Counter
	size                                    metrics.Gauge
	rebuilds                                metrics.CounterVec
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Instance == "" {
		c.Instance = "pool"
	}
	if c.RebuildSettle == 0 {
		c.RebuildSettle = 5 * time.Second
	}
}

// New returns a service; Run starts it.
func New(cfg Config) *Service {
	cfg.EnsureDefaults()
	s := &Service{cfg: cfg, central: cfg.Central, accounts: cfg.Accounts,
		alloc: pool.NewAllocator(cfg.Central, cfg.Instance, cfg.Local...)}
	s.rebuilds = cfg.Metrics.NewCounterVec("surge_uin_pool_rebuilds_total", "rebuilds of the pool from uin.pool after Redis lost it, by outcome", "outcome")
	s.keeper = cfg.Central.NewKeeper(cfg.Kafka, cfg.Namespace+schemas.TopicPool, pool.RebuildOptions{
		Settle: cfg.RebuildSettle, Held: cfg.Accounts.ExistMany, Log: cfg.Log})
	s.keeper.OnReady = s.alloc.Kick
	s.keeper.OnRebuild = func(sum pool.RebuildSummary, err error) {
		switch {
		case err != nil:
			s.rebuilds.With("failed").Inc()
		case sum.Waited:
			s.rebuilds.With("waited").Inc()
		default:
			s.rebuilds.With("rebuilt").Inc()
		}
	}
	ops := cfg.Metrics.NewCounterVec("surge_uin_pool_ops_total", "uins allocated, released back and releases refused", "op")
	s.allocated, s.released, s.refused = ops.With("allocate"), ops.With("release"), ops.With("release_refused")
	s.givenBack = ops.With("given_back") // committed for a caller that had gone, put back
	s.size = cfg.Metrics.NewGaugeVec("surge_uin_pool_central_size", "uins in the central pool's buckets").With()
	return s
}

// Allocator is the service's local pool.
func (s *Service) Allocator() *pool.Allocator { return s.alloc }

// Addr is where the API listens once Run has bound it.
func (s *Service) Addr() string {
	if l := s.listener.Load(); l != nil {
		return (*l).Addr().String()
	}
	return ""
}

// Run serves the API, keeps the local pool, watches the central pool's
// size and applies releases until ctx ends.
func (s *Service) Run(ctx context.Context, opts ...streams.Option) error {
	if s.cfg.Keys == nil {
		return errors.New("uin-pool: no api keys (uin.pool_keys)")
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("uin-pool: listen %s: %w", s.cfg.Addr, err)
	}
	s.listener.Store(&ln)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 5)
	go func() { errs <- s.keeper.Run(ctx) }()
	go func() { errs <- s.alloc.Run(ctx) }()
	go func() { errs <- s.watch(ctx) }()
	go func() { errs <- s.consumeReleases(ctx, opts...) }()
	adm := s.cfg.Admission
	adm.Name, adm.Metrics = "uin-pool", s.cfg.Metrics
	srv := admission.Server(admission.New(adm).Instrumented("uin-pool", s.Handler()), s.cfg.Limits)
	srv.Protocols = protocols()
	go func() {
		if err := srv.Serve(admission.LimitListener(ln, s.cfg.Limits)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- err
		}
	}()
	s.cfg.Log.Info("uin-pool: serving", "addr", ln.Addr().String(), "owner", s.alloc.Owner())
	var first error
	select {
	case <-ctx.Done():
	case first = <-errs:
	}
	// Stop taking calls first, then give the lease back (Allocator.Run).
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	cancel()
	for range 4 { // the keeper, the allocator (which gives its lease back), watch, releases
		if err := <-errs; err != nil && first == nil && !errors.Is(err, context.Canceled) {
			first = err
		}
	}
	return first
}

// protocols serves HTTP/1.1 and cleartext HTTP/2 (h2c, prior knowledge):
// a registration service multiplexing its calls over one HTTP/2
// connection costs the pool far fewer syscalls per allocation.
func protocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// watch reports the central pool's size, and says loudly when it falls
// under the low-water mark (recycling or gap filling must refill it).
func (s *Service) watch(ctx context.Context) error {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		if n, err := s.central.Size(ctx); err == nil {
			s.central0.Store(n)
			s.size.Set(float64(n))
			low := n < s.cfg.LowWater
			if low && !s.low.Load() {
				s.cfg.Log.Warn("uin-pool: central pool low: recycle or fill gaps to refill it", "size", n, "low_water", s.cfg.LowWater)
			} else if !low && s.low.Load() {
				s.cfg.Log.Info("uin-pool: central pool above low water again", "size", n)
			}
			s.low.Store(low)
		}
		if n, err := s.central.Leased(ctx); err == nil {
			s.leased.Store(n)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Handler is the authenticated API.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range s.routes() {
		mux.HandleFunc(pattern, h)
	}
	outer := http.NewServeMux()
	outer.Handle("/", s.cfg.Keys.Require(mux))
	outer.HandleFunc(openapi.Route, openapi.Handler(OpenAPI)) // no key: the description holds no data
	return outer
}

// giveBack puts uins committed for r's caller, who never received them,
// back into the local pool, and counts what went back.
func (s *Service) giveBack(r *http.Request, uins []uint32, failed string) {
	n, err := s.alloc.GiveBack(context.WithoutCancel(r.Context()), uins)
	if err != nil {
		s.cfg.Log.Warn(failed, "uins", len(uins), "err", err)
	}
	s.givenBack.Add(float64(n))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// routes are the API's endpoints ("METHOD /path" patterns) and their
// handlers; openapi.yaml describes each.
func (s *Service) routes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"POST /v1/uins": s.handleAllocate,
		"GET /v1/pool":  s.handlePool,
	}
}

// Routes are the patterns the API serves.
func Routes() []string {
	return slices.Sorted(slices.Values(append(slices.Collect(maps.Keys((&Service{}).routes())), openapi.Route)))
}

// OpenAPI is the API's OpenAPI 3 description.
//
//go:embed openapi.yaml
var OpenAPI []byte

func (s *Service) handleAllocate(w http.ResponseWriter, r *http.Request) {
	n := 1
	if q := r.URL.Query().Get("count"); q != "" {
		v, err := strconv.Atoi(q)
		if err != nil || v < 1 || v > MaxCount {
			httperr.Write(w, http.StatusBadRequest, httperr.BadRequest, fmt.Sprintf("count must be 1..%d", MaxCount))
			return
		}
		n = v
	}
	if !s.keeper.Peek(r.Context()) {
		w.Header().Set("Retry-After", "1")
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Rebuilding, "uin pool rebuilding from uin.pool")
		return
	}
	// A call may wait out the refill wait and then commit what it took.
	ctx, cancel := context.WithTimeout(r.Context(), s.alloc.RefillWait()+commitMargin)
	defer cancel()
	uins, err := s.alloc.Allocate(ctx, n)
	if err != nil && len(uins) > 0 {
		// Part of the call was committed before it failed (the caller
		// left, or the time ran out): nobody will receive those.
		s.giveBack(r, uins, "uin-pool: uins of a failed call not given back")
	}
	if r.Context().Err() != nil && err != nil {
		return // the caller left: nothing to answer
	}
	switch {
	case errors.Is(err, pool.ErrRebuilding):
		s.keeper.Lost()
		w.Header().Set("Retry-After", "1")
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Rebuilding, "uin pool rebuilding from uin.pool")
		return
	case errors.Is(err, pool.ErrExhausted):
		w.Header().Set("Retry-After", "1")
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Exhausted, "uin pool exhausted")
		return
	case err != nil:
		s.cfg.Log.Warn("uin-pool: allocation failed", "err", err)
		w.Header().Set("Retry-After", "1")
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Unavailable, "allocation unavailable: "+err.Error())
		return
	}
	if r.Context().Err() != nil {
		// The client left (a reset stream, its own timeout) before the
		// answer: nobody received these uins, so they go back, not
		// stranded as allocated.
		s.giveBack(r, uins, "uin-pool: uins of a caller that left not given back")
		return
	}
	s.allocated.Add(float64(len(uins)))
	writeJSON(w, http.StatusOK, map[string]any{"uins": uins})
}

func (s *Service) handlePool(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"central": s.central0.Load(), "leased": s.leased.Load(),
		"local": s.alloc.Held(), "low_water": s.cfg.LowWater, "low": s.low.Load(), "allocated": s.alloc.Allocated.Load()})
}

// consumeReleases applies RELEASE records from uin.pool. Each is applied
// once (pool.Central.Release keeps the applied offsets with the effect);
// one an account holds is refused to the dead-letter topic with a reason.
func (s *Service) consumeReleases(ctx context.Context, opts ...streams.Option) error {
	opts = append([]streams.Option{
		streams.Kafka(s.cfg.Kafka),
		streams.Declare(Spec, s.cfg.Namespace), // at least once: the effect is in Redis, applied once by offset
		streams.DeadLetterTopic(s.cfg.Namespace + schemas.TopicDeadLetter),
		streams.Logger(s.cfg.Log.With("processor", "uin-pool")),
		streams.Metrics(s.cfg.Metrics),
	}, opts...)
	r, err := streams.New("uin-pool", streams.Typed(s.handleRelease), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func (s *Service) handleRelease(ctx context.Context, in *kgo.Record, c *pb.PoolChange, _ *streams.Output) error {
	if c.Op != pb.PoolChange_RELEASE {
		return nil // insertions and the like: the pool's own log
	}
	if c.Uin == 0 || c.Uin > 1<<32-1 {
		return streams.Reject("bad uin", fmt.Errorf("release of uin %d: not a 32-bit account number", c.Uin))
	}
	if len(c.Uins) > 0 {
		return streams.Reject("bad release", fmt.Errorf("a release names one uin (uin), not a batch (uins)"))
	}
	if !pool.KeyFits(in.Key, c, s.central.Buckets()) {
		// Out of order with the uin's other changes, which are all in its
		// bucket's partition: the pool's rebuild could not place it.
		return streams.Reject("release not keyed by its bucket", fmt.Errorf("uin %d: key %x, want %x (allocation.ReleaseRecord)", c.Uin, in.Key, pool.BucketKey(uint32(c.Uin)%uint32(s.central.Buckets()))))
	}
	uin := uint32(c.Uin)
	out, err := s.central.Release(ctx, uin, s.accounts.Key(uin), in.Partition, in.Offset)
	if errors.Is(err, pool.ErrRebuilding) {
		s.keeper.Lost()
	}
	if err != nil {
		return err // Redis, or a pool being rebuilt: retried
	}
	switch out {
	case pool.Released:
		s.released.Inc()
	case pool.ReleaseHeld:
		s.refused.Inc()
		return streams.Reject("release refused: an account holds the uin", fmt.Errorf("uin %d", uin))
	case pool.ReleaseNotUsed:
		s.refused.Inc()
		return streams.Reject("release refused: the uin is not allocated", fmt.Errorf("uin %d", uin))
	}
	return nil
}

// ReleaseRecord is the record a registration service publishes to give
// back uin, allocated and never used: keyed by its bucket (of buckets,
// uin.buckets), so it is in order with the uin's other changes.
func ReleaseRecord(ns string, uin uint32, buckets int, at time.Time) (*kgo.Record, error) {
	b := uin % uint32(max(buckets, 1))
	return streams.NewRecord(ns+schemas.TopicPool, pool.BucketKey(b), &pb.PoolChange{Uin: uint64(uin), Op: pb.PoolChange_RELEASE, Bucket: b, AtMs: at.UnixMilli()})
}
