// Package grant is the wallet's intake: it validates a grant against the
// activity tree and the fund rules, makes it idempotent by order number,
// draws coupon stock, signs the cash token, keeps it in Redis for the
// user's reads and publishes grant and token. Booking happens later in the
// ledger; the token is the user's proof meanwhile.
package grant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/processors/wallet/counter"
	"surge/processors/wallet/guard"
	"surge/processors/wallet/order"
	"surge/processors/wallet/stock"
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
)

// Deps are the intake's dependencies.
type Deps struct {
	Config   *config.Source
	Keys     *token.Keyring
	Redis    redis.UniversalClient
	Producer *kgo.Client
	Counter  *counter.Counter // may be nil
	Log      *slog.Logger
	Metrics  *metrics.Registry
	Now      func() time.Time
	// Namespace prefixes every topic and Redis key (a unique one per test);
	// load-test traffic adds the shadow prefix on top.
	Namespace string
}

// Intake accepts grants.
type Intake struct {
	d       Deps
	live    lane
	shadow  lane
	local   *guard.Bucket
	global  *guard.Global
	mResult metrics.CounterVec
}

// lane is where a kind of traffic goes: real, or load test (shadow prefix
// on every topic and key, with a TTL on keys).
type lane struct {
	ns     string
	keys   string
	ttl    time.Duration
	tokens *Tokens
	stock  *stock.Control
}

// New returns an intake.
func New(d Deps) *Intake {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Metrics == nil {
		d.Metrics = metrics.NewRegistry()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	mk := func(ns, keys string, ttl time.Duration) lane {
		return lane{ns: ns, keys: keys, ttl: ttl, tokens: NewTokens(d.Redis, keys+"wtok:", ttl), stock: stock.New(d.Redis, keys+"wstock:", 8)}
	}
	ns := d.Namespace
	in := &Intake{d: d, live: mk(ns, ns, 0), shadow: mk(schemas.ShadowPrefix+ns, "shadow:"+ns, 24*time.Hour),
		local: guard.NewBucket(d.Config.Tree().RateLimits.GrantsPerInstance), global: guard.NewGlobal(d.Redis, ns+"wlimit:")}
	in.mResult = d.Metrics.NewCounterVec("surge_wallet_grants_total", "grants by outcome", "outcome")
	return in
}

// Tokens returns the live token store (reads use it).
func (in *Intake) Tokens() *Tokens { return in.live.tokens }

// Stock returns the live stock control.
func (in *Intake) Stock() *stock.Control { return in.live.stock }

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
	tree := in.d.Config.Tree()
	in.local.SetRate(tree.RateLimits.GrantsPerInstance)
	if !in.local.Allow(1) {
		return in.refuse("rate_limited", fmt.Errorf("%w: instance limit %d/s", ErrRateLimited, tree.RateLimits.GrantsPerInstance))
	}
	l := in.live
	if g.Shadow {
		l = in.shadow
	}
	if lim := tree.RateLimits.GrantsGlobal; lim > 0 && !tree.Degraded(guard.GlobalLimit) {
		ok, err := in.global.Allow(ctx, l.keys+"grants", lim, 1)
		if err == nil && !ok {
			return in.refuse("rate_limited", fmt.Errorf("%w: global limit %d/s", ErrRateLimited, lim))
		}
	}
	now := in.d.Now()
	if g.AtMs == 0 {
		g.AtMs = now.UnixMilli()
	}
	if err := order.Check(g); err != nil {
		return in.refuse("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	if g.Amount <= 0 {
		return in.refuse("invalid", fmt.Errorf("%w: amount %d must be positive", ErrInvalid, g.Amount))
	}
	parent := g.ParentActivityId
	if parent == "" {
		parent = g.ActivityId
	}
	phase, scene, err := tree.Resolve(parent, g.SceneId, time.UnixMilli(g.AtMs))
	if err != nil {
		return in.refuse("invalid", fmt.Errorf("%w: %v", ErrInvalid, err))
	}
	award, _ := config.Award(scene.Award)
	if award != g.AwardType {
		return in.refuse("invalid", fmt.Errorf("%w: scene %s grants %s, not %s", ErrInvalid, scene.ID, scene.Award, g.AwardType))
	}
	if g.Amount > scene.MaxAmount {
		return in.refuse("over_cap", fmt.Errorf("%w: %d > %d", ErrOverCap, g.Amount, scene.MaxAmount))
	}
	g.ParentActivityId, g.ActivityId, g.TemplateId = parent, phase.ID, scene.Template

	// Idempotency first: a replayed order number gets the original answer
	// and spends no budget or stock.
	idem := l.keys + "wgrant:" + g.OrderNo
	fresh, err := in.d.Redis.SetNX(ctx, idem, phase.ID, 30*24*time.Hour).Result()
	if err != nil {
		return nil, fmt.Errorf("grant: idempotency check: %w", err)
	}
	if !fresh {
		in.mResult.With("duplicate").Inc()
		res := &Result{Duplicate: true, Activity: phase.ID}
		if g.AwardType == pb.AwardType_CASH && !tree.Degraded(guard.TokenRedis) {
			res.Token, _ = l.tokens.Get(ctx, g.ActId, g.OrderNo)
		}
		return res, nil
	}
	undo := func() { _ = in.d.Redis.Del(context.WithoutCancel(ctx), idem).Err() }
	if phase.Budget > 0 {
		key := l.keys + "wbudget:" + phase.ID
		spent, err := in.d.Redis.IncrBy(ctx, key, g.Amount).Result()
		if err != nil {
			undo()
			return nil, fmt.Errorf("grant: budget: %w", err)
		}
		refund := func() { _ = in.d.Redis.DecrBy(context.WithoutCancel(ctx), key, g.Amount).Err() }
		if spent > phase.Budget {
			refund()
			undo()
			return in.refuse("over_budget", fmt.Errorf("%w: %s has %d of %d left", ErrOverBudget, phase.ID, phase.Budget-(spent-g.Amount), phase.Budget))
		}
		prev := undo
		undo = func() { refund(); prev() }
	}
	if g.AwardType == pb.AwardType_COUPON && scene.Switches.StockControl {
		if tree.Degraded(guard.Stock) {
			undo()
			return in.refuse("degraded", fmt.Errorf("%w: coupon stock", ErrDegraded))
		}
		if err := l.stock.Take(ctx, scene.Template, scene.Stock, g.Amount); err != nil {
			if !errors.Is(err, stock.ErrTimeout) { // a timed-out take may have counted: keep the order number spent
				undo()
			}
			return in.refuse("out_of_stock", err)
		}
	}
	res := &Result{Activity: phase.ID}
	recs := make([]*kgo.Record, 0, 2)
	gr, err := streams.NewRecord(l.ns+schemas.TopicGrants, []byte(g.ActId), g)
	if err != nil {
		undo()
		return nil, err
	}
	recs = append(recs, gr)
	if g.AwardType == pb.AwardType_CASH {
		tok := &pb.Token{AppId: g.AppId, ActId: g.ActId, ActivityId: phase.ID, SceneId: g.SceneId, Amount: g.Amount,
			OutTradeNo: g.OrderNo, OpenTime: now.UnixMilli(), RainId: g.RainId, Status: pb.TokenStatus_PROCESSING}
		in.d.Keys.Sign(tok)
		res.Token = tok
		if !tree.Degraded(guard.TokenRedis) {
			if err := l.tokens.Put(ctx, tok); err != nil {
				in.d.Log.Warn("grant: token not cached in Redis; reads show it once booked", "order", g.OrderNo, "err", err)
			}
		}
		tr, err := streams.NewRecord(l.ns+schemas.TopicTokens, []byte(g.ActId), tok)
		if err != nil {
			undo()
			return nil, err
		}
		recs = append(recs, tr)
	}
	if err := in.d.Producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		undo() // not published: let the caller retry the same order number
		return nil, fmt.Errorf("grant: publish: %w", err)
	}
	if in.d.Counter != nil && g.AwardType == pb.AwardType_CASH && !tree.Degraded(guard.Counter) && !g.Shadow {
		in.d.Counter.Add(g.Amount)
	}
	in.mResult.With("accepted").Inc()
	return res, nil
}
