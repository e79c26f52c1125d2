// Package api is the wallet's small HTTP API: grant intake for the
// activity side, and the user-facing balance, flow list and withdrawal.
// Request and response bodies are JSON; records use protobuf's JSON form.
package api

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"surge/streams/openapi"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/internal/counter"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/ledger"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/httperr"
)

// Granter accepts one grant: the Intake itself, or a grant.Batcher that
// coalesces concurrent requests into batches (one signature, one Redis
// round trip and one produce per batch).
type Granter interface {
	Grant(ctx context.Context, g *pb.RewardGrant) (*grant.Result, error)
	GrantBatch(ctx context.Context, gs []*pb.RewardGrant) []grant.Outcome
}

// Config configures the API: the intake and ledger it fronts, and who may
// call it.
type Config struct {
	streams.Env
	Intake   *grant.Intake
	Batcher  Granter // when set, grants go through it instead of Intake
	Ledger   *ledger.Ledger
	Counter  *counter.Counter
	Producer *kgo.Client
	Redis    redis.UniversalClient
	Source   *config.Source
	Timeout  time.Duration // how long a withdrawal waits for the ledger's answer (default 10 s)
	// Advertise is this instance's own address (the ledger's
	// Config.Advertise), named on the reads it sends on to the owner of
	// their user.
	Advertise string
	// Apps verifies the activity services' signed grant requests, Users
	// the users' tokens. Both nil turns authentication off (benchmarks of
	// its cost only; `surge wallet` always sets them).
	Apps  *auth.Apps
	Users *auth.Users
	// Identities answers app accounts' actIDs (nil: the endpoint answers 503).
	Identities *identity.Resolver
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
}

// Server serves the API.
type Server struct {
	cfg Config

	forwarded atomic.Int64

	mu      sync.Mutex
	waiters map[string]chan *pb.Withdrawal

	perApp appLimits
}

// appLimits are this instance's per-app grant buckets
// (rate_limits.grants_per_app), made on an app's first grant and re-rated
// when the tree changes.
type appLimits struct {
	mu    sync.Mutex
	byApp map[string]*guard.Bucket
}

// allow takes n grants from app's bucket; false with the limit when the
// app is over it.
func (a *appLimits) allow(tree *config.Tree, app string, n int) (int, bool) {
	limit, named := tree.RateLimits.GrantsPerApp[app]
	if !named {
		limit = tree.RateLimits.GrantsPerApp["*"]
	}
	if limit <= 0 {
		return 0, true
	}
	a.mu.Lock()
	b := a.byApp[app]
	if b == nil {
		if a.byApp == nil {
			a.byApp = map[string]*guard.Bucket{}
		}
		b = guard.NewBucket(limit)
		a.byApp[app] = b
	}
	a.mu.Unlock()
	b.SetRate(limit)
	return limit, b.Allow(n)
}

// overAppLimit answers 429 with Retry-After when app may not make n more
// grants this second: before they are parsed further or cost Redis or
// Kafka anything.
func (s *Server) overAppLimit(w http.ResponseWriter, app string, n int) bool {
	if app == "" || s.cfg.Source == nil {
		return false
	}
	limit, ok := s.perApp.allow(s.cfg.Source.Tree(), app, n)
	if ok {
		return false
	}
	w.Header().Set("Retry-After", "1")
	fail(w, http.StatusTooManyRequests, fmt.Errorf("%w: app %s is over its limit of %d grants/s on this instance (%d asked)", grant.ErrRateLimited, app, limit, n))
	return true
}

// New returns a server; Handler serves it, FollowResults must run.
func New(cfg Config) *Server {
	cfg.EnsureDefaults()
	return &Server{cfg: cfg}
}

// FollowResults delivers the ledger's withdrawal answers to waiting
// requests; it runs until ctx ends.
func (s *Server) FollowResults(ctx context.Context) error {
	_, err := streams.FollowTable(ctx, s.cfg.Kafka, s.cfg.Namespace+schemas.TopicWithdrawResult, func(r *kgo.Record) {
		var w pb.Withdrawal
		if streams.Decode(r, &w) != nil {
			return
		}
		s.mu.Lock()
		key := waiterKey(&w)
		ch := s.waiters[key]
		delete(s.waiters, key)
		s.mu.Unlock()
		if ch != nil {
			ch <- &w
		}
	})
	return err
}

// routes are the API's endpoints ("METHOD /path" patterns), each with its
// handler behind its authentication; openapi.yaml describes each.
func (s *Server) routes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"POST /v1/grants":                  s.grant,
		"POST /v1/grants/batch":            s.grantBatch,
		"GET /v1/users/{act}/balance":      s.user(s.balance),
		"GET /v1/users/{act}/flow":         s.user(s.flow),
		"POST /v1/users/{act}/withdrawals": s.user(s.withdraw),
		"POST /v1/users/{act}/packets":     s.user(s.packet),
		"GET /v1/total":                    s.anyone(s.total),
		"GET /v1/stock/{template}":         s.anyone(s.stock),
		"GET /v1/identities/{app}/{user}":  s.app(s.identity),
		openapi.Route:                      openapi.Handler(OpenAPI),
	}
}

// Routes are the patterns the API serves.
func Routes() []string { return slices.Sorted(maps.Keys((&Server{}).routes())) }

// OpenAPI is the API's OpenAPI 3 description.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Handler routes the API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for pattern, h := range s.routes() {
		mux.HandleFunc(pattern, h)
	}
	return mux
}

func (s *Server) now() time.Time { return s.cfg.Now() }

func (s *Server) authOff() bool { return s.cfg.Apps == nil && s.cfg.Users == nil }

func reply(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

func fail(w http.ResponseWriter, code int, err error) {
	httperr.Write(w, code, httperr.ForStatus(code), err.Error())
}

// readBody reads a request body of at most limit bytes; a larger one is
// answered 413 (not read on, and not mistaken for a bad signature). Every
// handler reads its body through here, to its end: admission control
// gives a request with a body its slot there (streams/admission).
func readBody(w http.ResponseWriter, r *http.Request, limit int64, what string) ([]byte, bool) {
	// Read into a buffer of the announced size: a batch's body read by
	// io.ReadAll from 512 bytes up was copied through five growing
	// buffers. At most 64 KiB is taken on the caller's word, so a request
	// that announces megabytes and sends nothing holds little.
	buf := bytes.NewBuffer(make([]byte, 0, min(max(r.ContentLength, 0), limit, 64<<10)+1))
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	body := buf.Bytes()
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		fail(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%s larger than %d bytes", what, limit))
		return nil, false
	case err != nil:
		fail(w, http.StatusBadRequest, fmt.Errorf("malformed %s: %w", what, err))
		return nil, false
	}
	return body, true
}

// signedBody authenticates an app's request and reads its body (at most
// limit bytes). What the headers decide (key, timestamp, signature's
// shape) is decided before a byte of the body is read, so a caller
// without a key holds no memory; the body is hashed as it streams in and
// the signature checked once it is all there, before it is parsed.
func (s *Server) signedBody(w http.ResponseWriter, r *http.Request, limit int64, what string) (app string, body []byte, ok bool) {
	if s.authOff() {
		body, ok = readBody(w, r, limit, what)
		return "", body, ok
	}
	if s.cfg.Apps == nil {
		denied(w, fmt.Errorf("%w: no app keys configured", auth.ErrUnauthenticated))
		return "", nil, false
	}
	pending, err := s.cfg.Apps.Begin(r, s.now())
	if err != nil {
		denied(w, err)
		return "", nil, false
	}
	r.Body = hashedBody{io.TeeReader(r.Body, pending), r.Body}
	if body, ok = readBody(w, r, limit, what); !ok {
		return "", nil, false
	}
	if app, err = pending.Finish(); err != nil {
		denied(w, err)
		return "", nil, false
	}
	return app, body, true
}

// hashedBody is a request body read through its signature's hash.
type hashedBody struct {
	io.Reader
	io.Closer
}
