// Package grant is the wallet's intake: it validates a grant against the
// activity tree and the fund rules, makes it idempotent by order number,
// draws coupon stock, signs the cash token, keeps it in Redis for the
// user's reads and publishes it with the grant inside (other grants alone).
// Booking happens later in the ledger; the token is the user's proof
// meanwhile.
package grant

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"surge/processors/wallet/internal/tokencache"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/internal/stock"
	"surge/processors/wallet/internal/tally"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// Refusals. Each is a clear error; a refused grant is never published.
var (
	ErrInvalid     = errors.New("invalid grant")
	ErrOverCap     = errors.New("amount over the scene's per-grant cap")
	ErrOverBudget  = errors.New("activity budget exhausted")
	ErrRateLimited = errors.New("rate limited")
	ErrDegraded    = errors.New("switched off")
	// ErrRebuilding: a budget or stock counter is missing from Redis (it
	// lost its data) and is being rebuilt from the topics; retry shortly.
	ErrRebuilding = errors.New("budget and stock counters are being rebuilt from the topics; retry shortly")
	// ErrConflict: the order number was accepted before with a different
	// grant (amount, scene, rain, app). An order number is an idempotency
	// key: a retry must repeat the request, not change it.
	ErrConflict = errors.New("order number reused with a different grant")
)

// Config configures the intake: its stores, its producer and its rules.
type Config struct {
	// Env.Namespace prefixes every topic and Redis key (a unique one per
	// test); load-test traffic adds the shadow prefix on top.
	streams.Env
	Source   *config.Source // the wallet's configuration: activities, limits, switches
	Keys     *token.Keyring
	Redis    redis.UniversalClient
	Producer *kgo.Client
	// RebuildSettle is how long a rebuild of the counters waits before it
	// reads the topics, so grants that took from the lost counters are
	// published by then (default 5 s).
	RebuildSettle time.Duration
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.RebuildSettle == 0 {
		c.RebuildSettle = 5 * time.Second
	}
}

// Intake accepts grants.
type Intake struct {
	cfg     Config
	tally   tally.Counter
	rebuild *rebuilder
	live    lane
	shadow  lane
	local   *guard.Bucket
	global  *guard.Global
	mResult metrics.CounterVec
}

// lane is where a kind of traffic goes: real, or load test (shadow prefix
// on every topic and key, with a TTL on keys).
type lane struct {
	ns        string // topics
	keys      string // Redis keys
	ttl       time.Duration
	tokens    *tokencache.Cache
	stock     *stock.Control
	keyedCash *keyedCashClaims
}

// budgetKey is the counter of the budget phase has spent.
func (l *lane) budgetKey(phase string) string { return l.keys + "wbudget:" + phase }

// claimKey is the claim of an order number claimed by key (coupons,
// pendants, and cash while token Redis is switched off).
func (l *lane) claimKey(orderNo string) string { return l.keys + "wgrant:" + orderNo }

// claimMark is what a claim key holds: the phase, the batch that set it,
// the grant's fingerprint (a retry with other fields is a conflict) and
// when (a retry of an old claim publishes the grant again).
func claimMark(phase, batch string, g *pb.RewardGrant, atMs int64) string {
	return phase + " " + batch + " " + fingerprint(g) + " " + strconv.FormatInt(atMs, 10)
}

// New returns an intake.
func New(cfg Config) *Intake {
	cfg.EnsureDefaults()
	// Budget and stock counters are a cache of the topics: rebuilt from
	// them when missing. An intake with no cluster to read (tests of it
	// alone) starts a missing counter at zero instead.
	counters := tally.New(cfg.Redis, len(cfg.Kafka.Seeds) == 0)
	mk := func(ns, keys string, ttl time.Duration) lane {
		return lane{ns: ns, keys: keys, ttl: ttl, tokens: tokencache.New(cfg.Redis, keys+"wtok:", ttl), stock: stock.New(cfg.Redis, counters, keys+"wstock:", 8),
			keyedCash: &keyedCashClaims{marker: keys + "wgrant-cash-keyed"}}
	}
	ns := cfg.Namespace
	in := &Intake{cfg: cfg, tally: counters, live: mk(ns, ns, 0), shadow: mk(schemas.ShadowPrefix+ns, "shadow:"+ns, 24*time.Hour),
		local: guard.NewBucket(cfg.Source.Tree().RateLimits.GrantsPerInstance), global: guard.NewGlobal(cfg.Redis, ns+"wlimit:")}
	in.rebuild = newRebuilder(in)
	in.mResult = cfg.Metrics.NewCounterVec("surge_wallet_grants_total", "grants by outcome", "outcome")
	return in
}

// Tokens returns the live token store (reads use it).
func (in *Intake) Tokens() *tokencache.Cache { return in.live.tokens }

// Stock returns the live stock control.
func (in *Intake) Stock() *stock.Control { return in.live.stock }

// StockView is what an issuer reads of a coupon template before it offers
// one (the seed's strategy reads consumption and total, and offers
// something else below 10%).
type StockView struct {
	Template  string `json:"template"`
	Total     int64  `json:"total"`
	Remaining int64  `json:"remaining"` // sellable (total minus the 5% buffer) not yet taken
	Stop      bool   `json:"stop"`      // less than 10% of total remains: grants of it are refused
}

// ErrUnknownTemplate: no stock-controlled scene has the template.
var ErrUnknownTemplate = errors.New("unknown coupon template")

// StockOf reads template's stock as issuers see it.
func (in *Intake) StockOf(ctx context.Context, template string) (StockView, error) {
	for _, a := range in.cfg.Source.Tree().Activities {
		for _, sc := range a.Scenes {
			if sc.Template != template || !sc.Switches.StockControl {
				continue
			}
			rem, err := in.live.stock.Remaining(ctx, template, sc.Stock)
			if err != nil {
				return StockView{}, err
			}
			return StockView{Template: template, Total: sc.Stock, Remaining: rem,
				Stop: stock.Low(rem, sc.Stock)}, nil
		}
	}
	return StockView{}, fmt.Errorf("%w %q", ErrUnknownTemplate, template)
}

// Result of an accepted grant.
type Result struct {
	Token     *pb.Token // cash grants only
	Duplicate bool      // the order number was already accepted: nothing new published
	Activity  string    // the phase (child activity) the grant fell in
}

func (in *Intake) refuse(kind string, err error) (*Result, error) {
	in.mResult.With(kind).Inc()
	return nil, err
}

// Grant validates and accepts one grant. g.ActivityId is the parent
// activity as requested; on success it is the phase the grant fell in.
func (in *Intake) Grant(ctx context.Context, g *pb.RewardGrant) (*Result, error) {
	out := in.GrantBatch(ctx, []*pb.RewardGrant{g})
	return out[0].Result, out[0].Err
}

// Outcome is one grant's answer in a batch.
type Outcome struct {
	Result *Result
	Err    error
}

// pending is a grant on its way through a batch.
type pending struct {
	g         *pb.RewardGrant
	l         *lane
	phase     config.Child
	scene     config.Scene
	idem      string      // the order number's claim key; "" when the token is the claim
	mark      string      // what this grant's claim key holds (claim)
	tok       *pb.Token   // cash grants: the signed token
	tokBytes  []byte      // the token as the user's Redis hash keeps it (without its grant)
	tokRec    *kgo.Record // cash grants' one record: the token with its grant
	rec       *kgo.Record // other grants' record
	out       *Outcome
	spent     bool // budget taken (refund on failure)
	cached    bool // token written to Redis (removed on failure)
	fresh     bool
	unclaimed bool // order_claim switched off: its claim key, if any, is an earlier attempt's
}

// GrantBatch accepts many grants with one Redis round trip per stage and
// one produce. Every grant gets its own outcome; a refusal of one never
// affects another.
//
// A cash grant's order number is claimed by writing its signed token into
// the user's token hash with HSETNX: the claim and the token's cache are
// one command. A separate claim key (SET NX) cost a third of the intake's
// Redis time and held intake at about 75k grants/s on two cores
// (bench/wallet-notes.md). So a cash grant is budgeted and signed before
// its claim, and a duplicate gives its budget back. Other grants (coupon,
// pendant, and cash while token Redis is switched off) claim a key first,
// then spend budget and stock.
func (in *Intake) GrantBatch(ctx context.Context, gs []*pb.RewardGrant) []Outcome {
	outs := make([]Outcome, len(gs))
	tree := in.cfg.Source.Tree()
	in.local.SetRate(tree.RateLimits.GrantsPerInstance)
	now := in.cfg.Now()
	var keyed, tokened []*pending
	for i, g := range gs {
		p, err := in.validate(ctx, tree, g, now)
		if err != nil {
			outs[i] = Outcome{Err: err}
			continue
		}
		p.out = &outs[i]
		if g.AwardType == pb.AwardType_CASH && !tree.Degraded(guard.TokenRedis) {
			tokened = append(tokened, p)
		} else {
			p.idem = p.l.claimKey(g.OrderNo)
			keyed = append(keyed, p)
		}
	}
	tokened = in.claimedByKey(ctx, tokened, now)
	if len(keyed) > 0 && tree.Degraded(guard.OrderClaim) {
		for _, p := range keyed {
			p.fresh, p.unclaimed = true, true // no claim: the order number's consumers take it once
		}
	} else if len(keyed) > 0 {
		if err := in.claim(ctx, keyed, now); err != nil {
			for _, p := range keyed {
				*p.out = Outcome{Err: err}
			}
			keyed = nil
		}
	}
	fresh := append([]*pending(nil), tokened...) // a cash grant's claim comes after its budget
	for _, p := range keyed {
		if p.fresh {
			fresh = append(fresh, p)
		}
	}
	fresh = in.spendBudget(ctx, fresh)
	in.answerKnown(ctx, tokened)
	fresh = in.takeStock(ctx, tree, fresh)
	fresh = in.sign(ctx, fresh, now)
	fresh = in.claimTokens(ctx, fresh, now)
	if afterClaims != nil {
		afterClaims() // tests: a crash between the claims and the produce
	}
	in.publish(ctx, fresh)
	return outs
}

// afterClaims, when set (by tests only), runs between the batch's claims
// in Redis and its produce.
var afterClaims func()

func (in *Intake) validate(ctx context.Context, tree *config.Tree, g *pb.RewardGrant, now time.Time) (*pending, error) {
	if !in.local.Allow(1) {
		_, err := in.refuse("rate_limited", fmt.Errorf("%w: instance limit %d/s", ErrRateLimited, tree.RateLimits.GrantsPerInstance))
		return nil, err
	}
	l := &in.live
	if g.Shadow {
		l = &in.shadow
	}
	if lim := tree.RateLimits.GrantsGlobal; lim > 0 && !tree.Degraded(guard.GlobalLimit) {
		ok, err := in.global.Allow(ctx, l.keys+"grants", lim, 1)
		if err == nil && !ok {
			_, err := in.refuse("rate_limited", fmt.Errorf("%w: global limit %d/s", ErrRateLimited, lim))
			return nil, err
		}
	}
	bad := func(kind string, err error) (*pending, error) { _, err = in.refuse(kind, err); return nil, err }
	if g.AtMs == 0 {
		g.AtMs = now.UnixMilli()
	}
	// The caller's at_ms picks the phase: checked against this clock, so a
	// caller cannot grant into a phase that closed long ago or is not open.
	if err := tree.AcceptsGrantAt(time.UnixMilli(g.AtMs), now); err != nil {
		return bad("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if err := order.Check(g); err != nil {
		return bad("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if field, ok := validText(g); !ok {
		// Protobuf strings are UTF-8, and the record is encoded by hand
		// (token.MarshalWithGrant): a consumer would refuse it later.
		return bad("invalid", fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, field))
	}
	if g.Amount <= 0 {
		return bad("invalid", fmt.Errorf("%w: amount %d must be positive", ErrInvalid, g.Amount))
	}
	parent := g.ParentActivityId
	if parent == "" {
		parent = g.ActivityId
	}
	phase, scene, err := tree.Resolve(parent, g.SceneId, time.UnixMilli(g.AtMs))
	if err != nil {
		return bad("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	award, _ := config.Award(scene.Award)
	if award != g.AwardType {
		return bad("invalid", fmt.Errorf("%w: scene %s grants %s, not %s", ErrInvalid, scene.ID, scene.Award, g.AwardType))
	}
	if g.Amount > scene.MaxAmount {
		return bad("over_cap", fmt.Errorf("%w: %d > %d", ErrOverCap, g.Amount, scene.MaxAmount))
	}
	g.ParentActivityId, g.ActivityId, g.TemplateId = parent, phase.ID, scene.Template
	return &pending{g: g, l: l, phase: phase, scene: scene}, nil
}

// validText reports whether the grant's text fields are UTF-8, and if not
// which one is not.
func validText(g *pb.RewardGrant) (string, bool) {
	for _, f := range [...]struct{ name, v string }{{"order_no", g.OrderNo}, {"act_id", g.ActId}, {"activity_id", g.ActivityId},
		{"scene_id", g.SceneId}, {"rain_id", g.RainId}, {"app_id", g.AppId}, {"template_id", g.TemplateId}, {"parent_activity_id", g.ParentActivityId}} {
		if !utf8.ValidString(f.v) {
			return f.name, false
		}
	}
	return "", true
}

// claim is the idempotency check of grants without a cached token: SETNX
// of every order number in one pipeline. A replayed order number spends no
// budget or stock. Two grants of one order number in the same batch: the
// second is the duplicate. Each claim holds the phase and a mark of this
// batch: if the pipeline fails, some claims may have landed, and only the
// ones this batch set are released, or the caller's retry would be taken
// for a duplicate of a grant that was never published.
func (in *Intake) claim(ctx context.Context, ps []*pending, now time.Time) error {
	batch := batchMark()
	pipe := in.cfg.Redis.Pipeline()
	cmds := make([]*redis.BoolCmd, len(ps))
	held := make([]*redis.StringCmd, len(ps))
	marked := map[*keyedCashClaims]bool{}
	for i, p := range ps {
		p.mark = claimMark(p.phase.ID, batch, p.g, now.UnixMilli())
		cmds[i] = pipe.SetNX(ctx, p.idem, p.mark, claimTTL)
		held[i] = pipe.Get(ctx, p.idem)                                           // ours if fresh, the first grant's if not
		if k := p.l.keyedCash; p.g.AwardType == pb.AwardType_CASH && !marked[k] { // token Redis is switched off
			pipe.Set(ctx, k.marker, 1, keyedCashWindow)
			k.seen()
			marked[k] = true
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		release := in.cfg.Redis.Pipeline()
		for _, p := range ps {
			releaseClaimScript.Eval(context.WithoutCancel(ctx), release, []string{p.idem}, p.mark)
		}
		_, _ = release.Exec(context.WithoutCancel(ctx))
		return fmt.Errorf("grant: idempotency check: %w", err)
	}
	var again []*pending
	for i, p := range ps {
		if p.fresh = cmds[i].Val(); !p.fresh {
			// No token: a cash grant claims by key only while token Redis is off.
			in.duplicate(p, sameClaim(held[i].Val(), p.g), nil)
			if p.out.Err == nil && claimAge(held[i].Val(), now) > republishAfter {
				p.mark = held[i].Val() // renewed with its new time once published again
				again = append(again, p)
			}
		}
	}
	in.republishKeyed(ctx, again, now)
	return nil
}

// claimAge is how long ago a claim key's value was set (0 when it does not
// say: set by an earlier build).
func claimAge(held string, now time.Time) time.Duration {
	f := strings.Fields(held)
	if len(f) < 4 {
		return 0
	}
	ms, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return 0
	}
	return now.Sub(time.UnixMilli(ms))
}

// republishKeyed publishes again the grants claimed by key whose claim is
// older than republishAfter: the first attempt may have died between its
// claim and its produce, and nothing else would ever publish them. Their
// consumers take an order number once (the ledger books a cash token's
// once; wallet.grants is keyed by order number). Each claim's time is
// renewed with the publish, so one order number goes out again at most
// every republishAfter however often it is retried. Budget and stock were
// taken by the first attempt and are not taken again.
func (in *Intake) republishKeyed(ctx context.Context, ps []*pending, now time.Time) {
	if len(ps) == 0 {
		return
	}
	in.makeTokens(ps, now)
	var recs []*kgo.Record
	var of []*pending
	for _, p := range ps {
		if err := in.encode(p); err != nil {
			*p.out = Outcome{Err: err}
			continue
		}
		rec := p.rec
		if p.tokRec != nil {
			rec = p.tokRec
		}
		recs, of = append(recs, rec), append(of, p)
	}
	for i, res := range in.cfg.Producer.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			*of[i].out = Outcome{Err: fmt.Errorf("grant: publish again: %w", res.Err)}
			continue
		}
		in.mResult.With("published_again").Inc()
		renewed := strings.Fields(of[i].mark)
		renewed[len(renewed)-1] = strconv.FormatInt(now.UnixMilli(), 10)
		_ = in.cfg.Redis.SetArgs(ctx, of[i].idem, strings.Join(renewed, " "), redis.SetArgs{KeepTTL: true}).Err()
	}
}

// duplicate answers a grant whose order number was claimed before: the
// first grant's answer if this one repeats it, a conflict if it differs.
func (in *Intake) duplicate(p *pending, same bool, tok *pb.Token) {
	if !same {
		in.mResult.With("conflict").Inc()
		*p.out = Outcome{Err: fmt.Errorf("%w: %s was granted before with different fields (amount, scene, rain or app)", ErrConflict, p.g.OrderNo)}
		return
	}
	in.mResult.With("duplicate").Inc()
	*p.out = Outcome{Result: &Result{Duplicate: true, Activity: p.phase.ID, Token: tok}}
}

// fingerprint is what makes two grants of one order number the same
// request: every field but the time.
func fingerprint(g *pb.RewardGrant) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q %q %d %d %d %q", g.ActId, g.ParentActivityId, g.SceneId, g.RainId, g.AwardType, g.Amount, g.Stage, g.AppId)
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// sameClaim reports whether a claim key's value (phase, batch mark,
// fingerprint) was set by a grant equal to g. A claim without a
// fingerprint (set by an earlier build) is taken as equal.
func sameClaim(held string, g *pb.RewardGrant) bool {
	f := strings.Fields(held)
	return len(f) < 3 || f[2] == fingerprint(g)
}

// sameToken reports whether tok, the token an order number already has,
// was made from a grant equal to g.
func sameToken(tok *pb.Token, g *pb.RewardGrant) bool {
	return tok.ActId == g.ActId && tok.SceneId == g.SceneId && tok.RainId == g.RainId && tok.Amount == g.Amount && tok.AppId == g.AppId
}

// claimTTL is how long a claim key holds its order number.
const claimTTL = 30 * 24 * time.Hour

// keyedCashWindow is how long after the last cash grant claimed by key its
// retries are looked for: a client retries within minutes or hours, and
// the lookups cost intake Redis work for as long as they run. A retry
// later than this is accepted again; its budget is counted twice (the cap
// refuses early) and the ledger books the order once.
const keyedCashWindow = 24 * time.Hour

// keyedCashClaims tells whether a lane may hold cash grants claimed by key:
// while token Redis is switched off a cash grant's order number is claimed
// by its own key, not in the user's token hash, and a retry after the
// switch is back on must find that claim. A marker key lives for
// keyedCashWindow after the last such claim; while it does, cash grants
// also look up their claim key (one EXISTS each: intake ran about 12%
// slower with the lookups on, bench/wallet-notes.md), and otherwise not
// at all.
type keyedCashClaims struct {
	marker  string
	checked atomic.Int64 // unix nanoseconds of the last look at the marker
	present atomic.Bool
}

// markerRecheck bounds how stale the answer about the marker may be: a
// grant claimed by key on another instance less than this before the
// switch came back on may be accepted again when retried here.
const markerRecheck = time.Second

func (k *keyedCashClaims) seen() { k.present.Store(true); k.checked.Store(time.Now().UnixNano()) }

// mayExist reports whether claim keys of cash grants may exist.
func (k *keyedCashClaims) mayExist(ctx context.Context, rdb redis.UniversalClient, now time.Time) bool {
	if now.UnixNano()-k.checked.Load() < int64(markerRecheck) {
		return k.present.Load()
	}
	n, err := rdb.Exists(ctx, k.marker).Result()
	if err != nil {
		return true // unknown: look the claims up
	}
	k.present.Store(n > 0)
	k.checked.Store(now.UnixNano())
	return n > 0
}

// claimedByKey answers, among cash grants about to be claimed through
// their token, those whose order number was already claimed by key while
// token Redis was switched off: duplicates, without their token (it was
// never kept in Redis). It returns the others.
func (in *Intake) claimedByKey(ctx context.Context, tokened []*pending, now time.Time) []*pending {
	var look []*pending
	for _, p := range tokened {
		if p.l.keyedCash.mayExist(ctx, in.cfg.Redis, now) {
			look = append(look, p)
		}
	}
	if len(look) == 0 {
		return tokened
	}
	pipe := in.cfg.Redis.Pipeline()
	cmds := make(map[*pending]*redis.StringCmd, len(look))
	for _, p := range look {
		cmds[p] = pipe.Get(ctx, p.l.claimKey(p.g.OrderNo))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		for _, p := range look {
			*p.out = Outcome{Err: fmt.Errorf("grant: idempotency check: %w", err)}
		}
		return slices.DeleteFunc(tokened, func(p *pending) bool { return cmds[p] != nil })
	}
	return slices.DeleteFunc(tokened, func(p *pending) bool {
		if cmd := cmds[p]; cmd != nil && cmd.Err() == nil {
			in.duplicate(p, sameClaim(cmd.Val(), p.g), nil)
			return true
		}
		return false
	})
}

// releaseClaimScript deletes a claim key only if it still holds the given
// mark.
var releaseClaimScript = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// batchMark is unique to one batch of this process.
func batchMark() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// undo releases what a grant claimed, so the caller may retry it.
func (in *Intake) undo(ctx context.Context, ps []*pending) {
	if len(ps) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	pipe := in.cfg.Redis.Pipeline()
	for _, p := range ps {
		if p.idem != "" && !p.unclaimed {
			pipe.Del(ctx, p.idem)
		}
		if p.spent {
			in.tally.Give(ctx, pipe, p.l.budgetKey(p.phase.ID), p.g.Amount)
		}
		if p.cached { // or the user would see a token that never books
			p.l.tokens.Release(ctx, pipe, p.tok, p.tokBytes)
		}
	}
	_, _ = pipe.Exec(ctx)
}

// spendBudget takes the budget of a phase once for all its grants; if the
// sum does not fit, it takes grant by grant, so the grants that fit still
// pass. A budget counter that is missing (Redis lost it) refuses its
// grants with ErrRebuilding and has it rebuilt from the topics.
func (in *Intake) spendBudget(ctx context.Context, ps []*pending) []*pending {
	groups := map[string][]*pending{}
	for _, p := range ps {
		if p.phase.Budget > 0 {
			k := p.l.budgetKey(p.phase.ID)
			groups[k] = append(groups[k], p)
		}
	}
	failed := map[*pending]bool{}
	for key, group := range groups {
		var sum int64
		for _, p := range group {
			sum += p.g.Amount
		}
		budget := group[0].phase.Budget
		_, err := in.tally.Take(ctx, key, sum, budget)
		if err == nil {
			for _, p := range group {
				p.spent = true
			}
			continue
		}
		for _, p := range group { // slow path: one by one
			err := err
			if errors.Is(err, tally.ErrOver) {
				_, err = in.tally.Take(ctx, key, p.g.Amount, budget)
			}
			switch {
			case err == nil:
				p.spent = true
				continue
			case errors.Is(err, tally.ErrOver):
				_, e := in.refuse("over_budget", fmt.Errorf("%w: %s has less than %d of %d left", ErrOverBudget, p.phase.ID, p.g.Amount, budget))
				*p.out = Outcome{Err: e}
			case errors.Is(err, tally.ErrMissing):
				in.rebuild.trigger()
				_, e := in.refuse("rebuilding", fmt.Errorf("%w: budget of %s", ErrRebuilding, p.phase.ID))
				*p.out = Outcome{Err: e}
			default:
				*p.out = Outcome{Err: fmt.Errorf("grant: budget: %w", err)}
			}
			failed[p] = true
		}
	}
	return in.keep(ctx, ps, failed)
}

// keep drops the failed grants from ps and releases their claims.
func (in *Intake) keep(ctx context.Context, ps []*pending, failed map[*pending]bool) []*pending {
	if len(failed) == 0 {
		return ps
	}
	var ok, bad []*pending
	for _, p := range ps {
		if failed[p] {
			bad = append(bad, p)
		} else {
			ok = append(ok, p)
		}
	}
	in.undo(ctx, bad)
	return ok
}

func (in *Intake) takeStock(ctx context.Context, tree *config.Tree, ps []*pending) []*pending {
	failed := map[*pending]bool{}
	for _, p := range ps {
		if p.g.AwardType != pb.AwardType_COUPON || !p.scene.Switches.StockControl {
			continue
		}
		var err error
		if tree.Degraded(guard.Stock) {
			_, err = in.refuse("degraded", fmt.Errorf("%w: coupon stock", ErrDegraded))
		} else if err = p.l.stock.CheckStop(ctx, p.scene.Template, p.scene.Stock); err != nil {
			if errors.Is(err, stock.ErrLow) {
				in.mResult.With("stock_low").Inc()
			}
		} else if err = p.l.stock.Take(ctx, p.scene.Template, p.scene.Stock, p.g.Amount); err != nil && !errors.Is(err, tally.ErrMissing) {
			in.mResult.With("out_of_stock").Inc()
			if errors.Is(err, stock.ErrTimeout) {
				p.idem = "" // a timed-out take may have counted: keep the order number spent
			}
		}
		if errors.Is(err, tally.ErrMissing) {
			in.rebuild.trigger()
			_, err = in.refuse("rebuilding", fmt.Errorf("%w: stock of %s", ErrRebuilding, p.scene.Template))
		}
		if err != nil {
			*p.out = Outcome{Err: err}
			failed[p] = true
		}
	}
	return in.keep(ctx, ps, failed)
}

// answerKnown answers as duplicates the cash grants refused over budget
// whose order number was accepted before: a retry must get its original
// token, not a refusal, whatever budget is left.
func (in *Intake) answerKnown(ctx context.Context, tokened []*pending) {
	var refused []*pending
	for _, p := range tokened {
		if errors.Is(p.out.Err, ErrOverBudget) {
			refused = append(refused, p)
		}
	}
	for i, tok := range in.knownTokens(ctx, refused) {
		if tok != nil {
			in.duplicate(refused[i], sameToken(tok, refused[i].g), tok)
		}
	}
}

// knownTokens reads the tokens already held for ps's order numbers (nil
// where none is, or the read failed) in one round trip: once the budget
// is gone every grant of a batch is looked up.
func (in *Intake) knownTokens(ctx context.Context, ps []*pending) []*pb.Token {
	if len(ps) == 0 {
		return nil
	}
	pipe := in.cfg.Redis.Pipeline()
	cmds := make([]*redis.StringCmd, len(ps))
	for i, p := range ps {
		cmds[i] = p.l.tokens.GetIn(ctx, pipe, p.g.ActId, p.g.OrderNo)
	}
	_, _ = pipe.Exec(ctx) // redis.Nil for the absent ones; each command keeps its own answer
	toks := make([]*pb.Token, len(ps))
	for i, cmd := range cmds {
		toks[i], _ = tokencache.Decode(cmd)
	}
	return toks
}

// sign makes and signs the cash grants' tokens (token.SignBatch: one
// signature per token.BatchSize tokens, a Merkle batch) and encodes the
// records. A cash grant is one record, its token on wallet.tokens with the
// grant inside (Token.grant), not a grant on wallet.grants and a token:
// the broker's work is per record and per partition batch more than per
// byte, and on the real broker intake ran about a sixth faster
// (bench/wallet-notes.md). Other grants go to wallet.grants.
func (in *Intake) sign(ctx context.Context, ps []*pending, now time.Time) []*pending {
	in.makeTokens(ps, now)
	failed := map[*pending]bool{}
	for _, p := range ps {
		if err := in.encode(p); err != nil {
			*p.out = Outcome{Err: err}
			failed[p] = true
		}
	}
	return in.keep(ctx, ps, failed)
}

// makeTokens makes and signs the cash grants' tokens.
func (in *Intake) makeTokens(ps []*pending, now time.Time) {
	var batch []*pb.Token
	for _, p := range ps {
		if g := p.g; g.AwardType == pb.AwardType_CASH {
			p.tok = &pb.Token{AppId: g.AppId, ActId: g.ActId, ActivityId: p.phase.ID, SceneId: g.SceneId, Amount: g.Amount,
				OutTradeNo: g.OrderNo, OpenTime: now.UnixMilli(), RainId: g.RainId, Status: pb.TokenStatus_PROCESSING}
			batch = append(batch, p.tok)
		}
	}
	in.cfg.Keys.SignBatch(batch)
}

// encode makes a grant's record: a cash grant's token with the grant in
// it, any other grant alone.
func (in *Intake) encode(p *pending) error {
	var err error
	if p.tok == nil {
		p.rec, err = streams.NewRecord(p.l.ns+schemas.TopicGrants, []byte(p.g.ActId), p.g)
	} else {
		v, n := token.MarshalWithGrant(p.tok, p.g)
		// The Redis hash keeps the token alone: the record's first n bytes.
		p.tokBytes = v[:n:n]
		p.tokRec = streams.NewEncodedRecord(p.l.ns+schemas.TopicTokens, []byte(p.g.ActId), p.tok, v)
	}
	return err
}

// claimTokens claims the order numbers of the cash grants whose token is
// the claim: HSETNX of each token into its user's hash, one pipeline. A
// grant whose order number is taken is a duplicate: it gets the token
// already there and its budget back.
func (in *Intake) claimTokens(ctx context.Context, ps []*pending, now time.Time) []*pending {
	pipe := in.cfg.Redis.Pipeline()
	var claiming []*pending // side by side with their commands (a map of 1,024 cost more than the claims' encoding)
	var cmds []*redis.BoolCmd
	for _, p := range ps {
		if p.idem == "" && p.tokRec != nil {
			claiming, cmds = append(claiming, p), append(cmds, p.l.tokens.Claim(ctx, pipe, p.tok, p.tokBytes))
		}
	}
	if len(cmds) == 0 {
		return ps
	}
	failed := map[*pending]bool{}
	if _, err := pipe.Exec(ctx); err != nil {
		// Some claims may have landed: release only what is ours.
		for _, p := range claiming {
			p.cached = true
			*p.out = Outcome{Err: fmt.Errorf("grant: idempotency check: %w", err)}
			failed[p] = true
		}
		return in.keep(ctx, ps, failed)
	}
	var dups []*pending
	for i, p := range claiming {
		if cmds[i].Val() {
			p.cached = true
		} else {
			dups = append(dups, p)
			failed[p] = true
		}
	}
	var again []*kgo.Record
	var againFor []*pending
	for i, tok := range in.knownTokens(ctx, dups) {
		p := dups[i]
		in.duplicate(p, tok == nil || sameToken(tok, p.g), tok)
		if tok != nil && tok.Status == pb.TokenStatus_PROCESSING && p.out.Err == nil && now.Sub(time.UnixMilli(tok.OpenTime)) > republishAfter {
			// Not booked yet, and perhaps never published: the first
			// attempt may have died between its claim and its produce.
			// The retry publishes the token held in Redis again; the
			// ledger books an order number once.
			v, _ := token.MarshalWithGrant(tok, p.g)
			again = append(again, streams.NewEncodedRecord(p.tokRec.Topic, p.tokRec.Key, tok, v))
			againFor = append(againFor, p)
		}
	}
	if len(again) > 0 {
		if err := in.cfg.Producer.ProduceSync(ctx, again...).FirstErr(); err != nil {
			for _, p := range againFor {
				*p.out = Outcome{Err: fmt.Errorf("grant: publish again: %w", err)}
			}
		}
	}
	return in.keep(ctx, ps, failed)
}

// republishAfter: a retry of a grant whose token is this old and not yet
// booked publishes the token again (its first attempt may have died
// between claim and produce). Younger, the first attempt is taken to be
// still on its way: concurrent duplicates publish nothing.
const republishAfter = 2 * time.Second

// publish produces the batch's records (a cash grant's token with its
// grant, any other grant alone) in one produce. The tokens are already in
// Redis (claimTokens); a failed produce takes them out again.
func (in *Intake) publish(ctx context.Context, ps []*pending) {
	if len(ps) == 0 {
		return
	}
	recs := make([]*kgo.Record, 0, len(ps))
	for _, p := range ps {
		if p.tokRec != nil {
			recs = append(recs, p.tokRec)
		} else {
			recs = append(recs, p.rec)
		}
		*p.out = Outcome{Result: &Result{Activity: p.phase.ID, Token: p.tok}}
	}
	// Only the records that failed are undone: the others are published,
	// and undoing them would let a retry publish its order number again.
	failed := map[*kgo.Record]error{}
	for _, res := range in.cfg.Producer.ProduceSync(ctx, recs...) {
		if res.Err != nil {
			failed[res.Record] = res.Err
		}
	}
	var undone []*pending
	for _, p := range ps {
		rec := p.rec
		if p.tokRec != nil {
			rec = p.tokRec
		}
		if err, bad := failed[rec]; bad {
			undone = append(undone, p) // not published: the caller may retry the same order number
			*p.out = Outcome{Err: fmt.Errorf("grant: publish: %w", err)}
			continue
		}
		in.mResult.With("accepted").Inc()
	}
	in.undo(ctx, undone)
}
