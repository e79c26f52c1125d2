// Package grant is the wallet's intake: it validates a grant against the
// activity tree and the fund rules, makes it idempotent by order number,
// draws coupon stock, signs the cash token, keeps it in Redis for the
// user's reads and publishes it with the grant inside (other grants alone).
// Booking happens later in the ledger; the token is the user's proof
// meanwhile.
package grant

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"surge/processors/wallet/internal/tokencache"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/internal/stock"
	"surge/processors/wallet/internal/tally"
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
