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
	"strconv"
	"strings"
	"surge/streams/openapi"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/internal/counter"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/internal/stock"
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

// denied answers a refused caller: 401 for no or bad credentials, 403
// for good credentials that do not open this.
func denied(w http.ResponseWriter, err error) {
	if errors.Is(err, auth.ErrForbidden) {
		fail(w, http.StatusForbidden, err)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="surge-wallet"`)
	fail(w, http.StatusUnauthorized, err)
}

// userOf returns the subject of the request's user token.
func (s *Server) userOf(r *http.Request) (string, error) {
	tok := auth.Bearer(r)
	if tok == "" {
		return "", fmt.Errorf("%w: no user token (want Authorization: Bearer <token>)", auth.ErrUnauthenticated)
	}
	if s.cfg.Users == nil {
		return "", fmt.Errorf("%w: no user keys configured", auth.ErrUnauthenticated)
	}
	c, err := s.cfg.Users.Verify(tok, s.now())
	return c.Sub, err
}

// appOf returns the app that signed r, a request without a body ("" with
// authentication off); signedBody is its counterpart for a body.
func (s *Server) appOf(r *http.Request) (string, error) {
	if s.authOff() {
		return "", nil
	}
	if s.cfg.Apps == nil {
		return "", fmt.Errorf("%w: no app keys configured", auth.ErrUnauthenticated)
	}
	return s.cfg.Apps.Verify(r, nil, s.now())
}

// user lets through only the holder of a user token for the path's actID.
func (s *Server) user(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authOff() {
			next(w, r)
			return
		}
		sub, err := s.userOf(r)
		if err == nil && sub != r.PathValue("act") {
			err = fmt.Errorf("%w: the token is %s's, not %s's", auth.ErrForbidden, sub, r.PathValue("act"))
		}
		if err != nil {
			denied(w, err)
			return
		}
		next(w, r)
	}
}

// app lets through only a signed activity service (an app key): an
// identity links one person's accounts across apps, which no user token
// may ask for, not even its own holder's.
func (s *Server) app(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authOff() {
			next(w, r)
			return
		}
		if r.Header.Get(auth.HeaderSignature) == "" {
			err := fmt.Errorf("%w: only signed activity services (app keys) may read identities", auth.ErrForbidden)
			if auth.Bearer(r) == "" {
				err = fmt.Errorf("%w: no app signature", auth.ErrUnauthenticated)
			}
			denied(w, err)
			return
		}
		if _, err := s.appOf(r); err != nil {
			denied(w, err)
			return
		}
		next(w, r)
	}
}

// anyone lets through any authenticated caller: a user or an app.
func (s *Server) anyone(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.authOff() {
			next(w, r)
			return
		}
		var err error
		if r.Header.Get(auth.HeaderSignature) != "" {
			_, err = s.appOf(r)
		} else {
			_, err = s.userOf(r)
		}
		if err != nil {
			denied(w, err)
			return
		}
		next(w, r)
	}
}

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

func (s *Server) grant(w http.ResponseWriter, r *http.Request) {
	var g pb.RewardGrant
	app, body, ok := s.signedBody(w, r, 64<<10, "grant")
	if !ok || s.overAppLimit(w, app, 1) {
		return
	}
	if err := protojson.Unmarshal(body, &g); err != nil {
		fail(w, http.StatusBadRequest, fmt.Errorf("malformed grant: %w", err))
		return
	}
	code, out := s.grantOne(r.Context(), app, &g, true)
	reply(w, code, out)
}

// MaxBatch is the most grants one batch request may carry.
const MaxBatch = 1000

// grantBatch accepts up to MaxBatch grants in one signed request: the
// shape an activity service uses at the peak (one signature and one round
// trip for many grants). Each grant is answered on its own, in order,
// with the code and body /v1/grants would give it, less the token. The
// body is JSON ({"grants": [...]}), or with Content-Type
// application/x-protobuf a GrantBatch, answered with GrantResults:
// decoding and encoding JSON was a third of the batch's CPU.
func (s *Server) grantBatch(w http.ResponseWriter, r *http.Request) {
	app, body, ok := s.signedBody(w, r, 4<<20, "batch")
	if !ok {
		return
	}
	results := s.decodeBatch(w, r, body)
	if results == nil || s.overAppLimit(w, app, len(results)) {
		return
	}
	var gs []*pb.RewardGrant
	var asked []*batchItem
	for _, res := range results {
		if res.grant == nil {
			continue
		}
		if res.code, res.err = s.mayGrant(app, res.grant); res.err != nil {
			continue
		}
		gs, asked = append(gs, res.grant), append(asked, res)
	}
	for i, o := range s.granter().GrantBatch(r.Context(), gs) {
		asked[i].result, asked[i].err, asked[i].code = o.Result, o.Err, codeOf(o.Err)
	}
	if isProto(r) {
		out := &pb.GrantResults{Results: make([]*pb.GrantResult, len(results))}
		for i, res := range results {
			gr := &pb.GrantResult{Code: uint32(res.code)}
			if res.err != nil {
				gr.Error = res.err.Error()
			} else {
				gr.Duplicate, gr.Activity = res.result.Duplicate, res.result.Activity
			}
			out.Results[i] = gr
		}
		b, _ := proto.Marshal(out)
		w.Header().Set("Content-Type", protoType)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return
	}
	out := make([]map[string]any, len(results))
	for i, res := range results {
		// A caller at the peak needs the answer, not the signed token:
		// encoding it was a third of the batch's CPU.
		out[i] = answer(res.code, res.result, res.err, false)
		// An item's "code" is its HTTP status, as it always was; its
		// error's kind is "error_code".
		if kind, ok := out[i]["code"]; ok {
			out[i]["error_code"] = kind
		}
		out[i]["code"] = res.code
	}
	reply(w, http.StatusOK, map[string]any{"results": out})
}

// protoType is the media type of protobuf request and answer bodies.
const protoType = "application/x-protobuf"

func isProto(r *http.Request) bool {
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	return strings.TrimSpace(ct) == protoType
}

// batchItem is one grant of a batch and its answer.
type batchItem struct {
	grant  *pb.RewardGrant // nil when it did not decode
	code   int
	result *grant.Result // nil when err is set
	err    error
}

// decodeBatch reads a batch's grants from a JSON or protobuf body. A grant
// that does not decode is answered 400 on its own; a body that is not a
// batch of 1..MaxBatch grants is answered 400 here, and nil returned.
func (s *Server) decodeBatch(w http.ResponseWriter, r *http.Request, body []byte) []*batchItem {
	var items []*batchItem
	if isProto(r) {
		var b pb.GrantBatch
		if err := proto.Unmarshal(body, &b); err != nil || len(b.Grants) == 0 || len(b.Grants) > MaxBatch {
			fail(w, http.StatusBadRequest, fmt.Errorf("want a surge.v1.GrantBatch of 1..%d grants (%v)", MaxBatch, err))
			return nil
		}
		for _, g := range b.Grants {
			items = append(items, &batchItem{grant: g})
		}
		return items
	}
	var req struct {
		Grants []json.RawMessage `json:"grants"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Grants) == 0 || len(req.Grants) > MaxBatch {
		fail(w, http.StatusBadRequest, fmt.Errorf("want {\"grants\": [1..%d grants]}", MaxBatch))
		return nil
	}
	for _, raw := range req.Grants {
		var g pb.RewardGrant
		if err := protojson.Unmarshal(raw, &g); err != nil {
			items = append(items, &batchItem{code: http.StatusBadRequest, err: fmt.Errorf("malformed grant: %w", err)})
			continue
		}
		items = append(items, &batchItem{grant: &g})
	}
	return items
}

// grantOne accepts g for app ("" with authentication off) and returns the
// HTTP code and body of its answer, with the signed token if withToken.
func (s *Server) grantOne(ctx context.Context, app string, g *pb.RewardGrant, withToken bool) (int, map[string]any) {
	code, res, err := s.accept(ctx, app, g)
	return code, answer(code, res, err, withToken)
}

// accept grants g for app ("" with authentication off): the HTTP code of
// the outcome, the intake's result, and its error.
func (s *Server) accept(ctx context.Context, app string, g *pb.RewardGrant) (int, *grant.Result, error) {
	if code, err := s.mayGrant(app, g); err != nil {
		return code, nil, err
	}
	res, err := s.granter().Grant(ctx, g)
	return codeOf(err), res, err
}

// mayGrant checks that app ("" with authentication off) may make g, and
// makes it in app's name when g names none.
func (s *Server) mayGrant(app string, g *pb.RewardGrant) (int, error) {
	switch {
	case app == "" || g.AppId == app:
	case g.AppId == "":
		g.AppId = app
	default:
		return http.StatusForbidden, fmt.Errorf("%w: app %s may not grant as app %s", auth.ErrForbidden, app, g.AppId)
	}
	return http.StatusOK, nil
}

func (s *Server) granter() Granter {
	if s.cfg.Batcher != nil {
		return s.cfg.Batcher
	}
	return s.cfg.Intake
}

// codeOf is the HTTP code of a grant's outcome.
func codeOf(err error) int {
	code := http.StatusOK
	switch {
	case errors.Is(err, grant.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, grant.ErrInvalid), errors.Is(err, grant.ErrOverCap):
		code = http.StatusBadRequest
	case errors.Is(err, grant.ErrRateLimited):
		code = http.StatusTooManyRequests
	case errors.Is(err, grant.ErrOverBudget), errors.Is(err, stock.ErrOut), errors.Is(err, stock.ErrLow), errors.Is(err, grant.ErrDegraded):
		code = http.StatusConflict
	case err != nil:
		code = http.StatusServiceUnavailable
	}
	return code
}

// answer is the JSON body of one grant's outcome, answered with status.
func answer(status int, res *grant.Result, err error, withToken bool) map[string]any {
	if err != nil {
		return map[string]any{"error": err.Error(), "code": httperr.ForStatus(status)}
	}
	out := map[string]any{"duplicate": res.Duplicate, "activity": res.Activity}
	if res.Token != nil && withToken {
		tj, _ := protojson.Marshal(res.Token)
		out["token"] = json.RawMessage(tj)
	}
	return out
}

// forwardedHeader marks a read sent on by another instance: it is
// answered here or refused, never sent on again.
const forwardedHeader = "X-Surge-Forwarded-By"

// readFailed answers a read the local ledger could not: one of a user
// whose partition another instance owns is sent on to that instance.
func (s *Server) readFailed(w http.ResponseWriter, r *http.Request, err error) {
	var notOwner *ledger.NotOwnerError
	if !errors.As(err, &notOwner) {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	if by := r.Header.Get(forwardedHeader); by != "" {
		fail(w, http.StatusServiceUnavailable, fmt.Errorf("%w (sent here by %s; the group is rebalancing, retry)", err, by))
		return
	}
	owner, oerr := s.cfg.Ledger.Owner(r.Context(), r.PathValue("act"))
	if oerr != nil {
		fail(w, http.StatusServiceUnavailable, errors.Join(err, oerr))
		return
	}
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, strings.TrimSuffix(owner, "/")+r.URL.RequestURI(), nil)
	req.Header.Set(forwardedHeader, s.cfg.Advertise)
	req.Header.Set("Authorization", r.Header.Get("Authorization")) // the owner checks the caller again
	resp, ferr := ownerClient.Do(req)
	if ferr != nil {
		fail(w, http.StatusServiceUnavailable, fmt.Errorf("owner %s: %w", owner, ferr))
		return
	}
	defer resp.Body.Close()
	s.forwarded.Add(1)
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("X-Surge-Served-By", owner)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// ownerClient carries reads to their owner.
var ownerClient = &http.Client{Timeout: 2 * time.Second}

// Forwarded is how many reads this instance sent on to their owner.
func (s *Server) Forwarded() int64 { return s.forwarded.Load() }

func (s *Server) balance(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Ledger.Balance(r.Context(), r.PathValue("act"))
	if err != nil {
		s.readFailed(w, r, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"balance": v.Balance, "income": v.Income, "unbooked": v.Unbooked, "forged": v.Forged})
}

func (s *Server) flow(w http.ResponseWriter, r *http.Request) {
	page, err := intParam(r, "page", 0, 0, maxFlowPage)
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	size, err := intParam(r, "size", 20, 1, 100)
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	items, v, err := s.cfg.Ledger.Flow(r.Context(), r.PathValue("act"), page, size)
	if err != nil {
		s.readFailed(w, r, err)
		return
	}
	out := make([]map[string]any, len(items))
	for i, it := range items {
		out[i] = map[string]any{"order_no": it.OrderNo, "kind": it.Kind.String(), "amount": it.Amount, "at_ms": it.AtMs, "booked": it.Booked}
	}
	reply(w, http.StatusOK, map[string]any{"items": out, "balance": v.Balance, "page": page, "size": size})
}

// maxFlowPage is the last page a flow read may ask for (a wallet's flow
// holds far fewer items than 100 a page times this).
const maxFlowPage = 1_000_000

// intParam reads query parameter name: def when absent, else a decimal
// integer within [lo, hi], or an error that says what is wrong.
func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	raw := r.URL.Query().Get(name)
	if raw == "" {
		return def, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer from %d to %d", name, raw, lo, hi)
	}
	return n, nil
}

func (s *Server) total(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Counter == nil || s.cfg.Source.Tree().Degraded(guard.Counter) {
		fail(w, http.StatusServiceUnavailable, errors.New("live total switched off"))
		return
	}
	reply(w, http.StatusOK, map[string]any{"total": s.cfg.Counter.Shown()})
}

// identity answers an app account's actID (unified account, phone first).
func (s *Server) identity(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Identities == nil {
		fail(w, http.StatusServiceUnavailable, errors.New("no identity resolver"))
		return
	}
	act, err := s.cfg.Identities.ActID(r.Context(), r.PathValue("app"), r.PathValue("user"))
	switch {
	case errors.Is(err, identity.ErrUnknown):
		fail(w, http.StatusNotFound, err)
	case err != nil:
		fail(w, http.StatusServiceUnavailable, err)
	default:
		reply(w, http.StatusOK, map[string]string{"act_id": act})
	}
}

// stock answers an issuer's read of a coupon template's stock.
func (s *Server) stock(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Intake.StockOf(r.Context(), r.PathValue("template"))
	switch {
	case errors.Is(err, grant.ErrUnknownTemplate):
		fail(w, http.StatusNotFound, err)
	case err != nil:
		fail(w, http.StatusServiceUnavailable, err)
	default:
		reply(w, http.StatusOK, v)
	}
}

// releaseLock deletes a withdrawal lock only while it is still the
// caller's: after its TTL another withdrawal may hold it.
var releaseLock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// waiterKey names the request waiting for a ledger answer: withdrawals
// and red packets have ids of their own.
func waiterKey(w *pb.Withdrawal) string {
	if w.ToActId != "" {
		return "p:" + w.WithdrawId
	}
	return "w:" + w.WithdrawId
}

func (s *Server) withdraw(w http.ResponseWriter, r *http.Request) {
	var req struct {
		WithdrawID string `json:"withdraw_id"`
		Amount     int64  `json:"amount"`
	}
	body, ok := readBody(w, r, 4<<10, "withdrawal")
	if !ok {
		return
	}
	if err := json.Unmarshal(body, &req); err != nil || req.WithdrawID == "" || req.Amount <= 0 {
		fail(w, http.StatusBadRequest, errors.New("want {\"withdraw_id\": non-empty, \"amount\": positive cents}"))
		return
	}
	s.moveOut(w, r, &pb.Withdrawal{WithdrawId: req.WithdrawID, ActId: r.PathValue("act"), Amount: req.Amount})
}

// packet sends a person-to-person red packet from the path's user.
func (s *Server) packet(w http.ResponseWriter, r *http.Request) {
	var req struct {
		PacketID string `json:"packet_id"`
		To       string `json:"to"`
		Amount   int64  `json:"amount"`
	}
	act := r.PathValue("act")
	body, ok := readBody(w, r, 4<<10, "red packet")
	if !ok {
		return
	}
	if err := json.Unmarshal(body, &req); err != nil || req.PacketID == "" || req.To == "" || req.To == act || req.Amount <= 0 {
		fail(w, http.StatusBadRequest, errors.New("want {\"packet_id\": non-empty, \"to\": another user's actID, \"amount\": positive cents}"))
		return
	}
	s.moveOut(w, r, &pb.Withdrawal{WithdrawId: req.PacketID, ActId: act, Amount: req.Amount, ToActId: req.To})
}

// moveOut takes money out of a user's balance, a withdrawal or a red
// packet: the ledger books it (the user's unbooked tokens first) and
// answers on wallet.withdrawal-results.
func (s *Server) moveOut(w http.ResponseWriter, r *http.Request, req *pb.Withdrawal) {
	act, key := req.ActId, waiterKey(req)
	ctx := r.Context()
	// One withdrawal per user at a time (a double-clicked button); the
	// ledger's per-user order keeps the balance right even without it.
	if !s.cfg.Source.Tree().Degraded(guard.Lock) {
		lock := s.cfg.Namespace + "wlock:" + act
		ok, err := s.cfg.Redis.SetNX(ctx, lock, key, 10*time.Second).Result()
		if err == nil && !ok {
			// A retry of the same withdrawal or packet (its first try's instance
			// died holding the lock) goes on: the ledger books an id once.
			if holder, _ := s.cfg.Redis.Get(ctx, lock).Result(); holder != key {
				fail(w, http.StatusConflict, errors.New("another withdrawal of this user is in progress"))
				return
			}
		}
		if err == nil {
			defer releaseLock.Run(context.WithoutCancel(ctx), s.cfg.Redis, []string{lock}, key)
		}
	}
	ch := make(chan *pb.Withdrawal, 1)
	s.mu.Lock()
	if s.waiters == nil {
		s.waiters = map[string]chan *pb.Withdrawal{}
	}
	s.waiters[key] = ch
	s.mu.Unlock()
	defer func() { s.mu.Lock(); delete(s.waiters, key); s.mu.Unlock() }()
	req.AtMs = s.now().UnixMilli()
	rec, err := streams.NewRecord(s.cfg.Namespace+schemas.TopicWithdrawals, []byte(act), req)
	if err == nil {
		err = s.cfg.Producer.ProduceSync(ctx, rec).FirstErr()
	}
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	timeout := s.cfg.Timeout
	select {
	case res := <-ch:
		idKey := "withdraw_id"
		if req.ToActId != "" {
			idKey = "packet_id"
		}
		body := map[string]any{idKey: res.WithdrawId, "balance_after": res.BalanceAfter, "force_booked": res.ForceBooked}
		if res.Refused {
			body["error"], body["code"] = res.Reason, httperr.Conflict
			reply(w, http.StatusConflict, body)
			return
		}
		reply(w, http.StatusOK, body)
	case <-time.After(timeout):
		fail(w, http.StatusAccepted, errors.New("accepted; the ledger has not answered yet (retry with the same id)"))
	case <-ctx.Done():
	}
}
