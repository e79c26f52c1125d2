package grant

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// The budget each phase spent and the coupon stock each template gave out
// live in Redis as counters (tally), a cache of what the intake published:
// every accepted grant is on wallet.grants, or inside its token on
// wallet.tokens. When Redis loses them, the intake does not start them
// again at zero (that spends a budget twice): a missing counter refuses its
// grants (ErrRebuilding, 503) and one instance rebuilds every counter from
// the topics, then the grants go on.
//
// The rebuild waits RebuildSettle before it reads, so that grants which
// took from the lost counters just before the loss are on the topics by
// then; one published later than that would be missing from the sums.

// rebuilder runs at most one rebuild at a time in this process; a lock in
// Redis keeps instances from rebuilding side by side.
type rebuilder struct {
	in      *Intake
	mu      sync.Mutex
	running bool // a triggered rebuild runs
	mRuns   metrics.CounterVec
	seed    maphash.Seed
}

func newRebuilder(in *Intake) *rebuilder {
	return &rebuilder{in: in, seed: maphash.MakeSeed(),
		mRuns: in.cfg.Metrics.NewCounterVec("surge_wallet_counter_rebuilds_total", "rebuilds of the budget and stock counters from the topics, by outcome", "outcome")}
}

// trigger starts a rebuild in the background unless one runs.
func (r *rebuilder) trigger() {
	if len(r.in.cfg.Kafka.Seeds) == 0 {
		return // no topics to read: counters start at zero (tally.New)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running {
		return
	}
	r.running = true
	go func() {
		defer func() {
			r.mu.Lock()
			r.running = false
			r.mu.Unlock()
		}()
		if _, err := r.rebuild(context.Background(), nil); err != nil {
			r.in.cfg.Log.Error("wallet: counters not rebuilt; the next grant that needs one tries again", "err", err)
		}
	}()
}

// RebuildSummary is what a rebuild did.
type RebuildSummary struct {
	Records     int           // grant and token records read
	Counters    int           // budget and stock keys set (or kept: they existed)
	OrderClaims int           // coupon and pendant order claims set again
	Took        time.Duration // with the settle wait
}

// RebuildCounters rebuilds the budget and stock counters and the order
// claims from the topics on demand (`surge rebuild wallet`), calling
// progress every 10,000 records read. With force it first deletes the
// counters, so every one is set from the topics (grants that need them
// answer 503 meanwhile); without, only missing ones are set.
func (in *Intake) RebuildCounters(ctx context.Context, force bool, progress func(records int)) (RebuildSummary, error) {
	if len(in.cfg.Kafka.Seeds) == 0 {
		return RebuildSummary{}, errors.New("wallet: no Kafka cluster to rebuild the counters from")
	}
	if force {
		pipe := in.cfg.Redis.Pipeline()
		for _, k := range in.counterKeys() {
			pipe.Del(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return RebuildSummary{}, err
		}
	}
	return in.rebuild.rebuild(ctx, progress)
}

// EnsureCounters returns once every budget and stock counter of the
// activity tree exists, rebuilding them from the topics if any is missing:
// a wallet calls it before it serves grants.
func (in *Intake) EnsureCounters(ctx context.Context) error {
	if len(in.cfg.Kafka.Seeds) == 0 {
		return nil
	}
	missing, err := in.countersMissing(ctx)
	if err != nil || !missing {
		return err
	}
	_, err = in.rebuild.rebuild(ctx, nil)
	return err
}

// counterKeys are the Redis keys of every counter of the tree.
func (in *Intake) counterKeys() []string {
	var keys []string
	tree := in.cfg.Source.Tree()
	for _, l := range []*lane{&in.live, &in.shadow} {
		for _, ph := range budgeted(tree) {
			keys = append(keys, l.budgetKey(ph.ID))
		}
		for tpl := range stocked(tree) {
			keys = append(keys, l.stock.Keys(tpl)...)
		}
	}
	return keys
}

// countersMissing reports whether any counter of the tree is missing.
func (in *Intake) countersMissing(ctx context.Context) (bool, error) {
	keys := in.counterKeys()
	if len(keys) == 0 {
		return false, nil
	}
	pipe := in.cfg.Redis.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, err
	}
	for _, c := range cmds {
		if c.Val() == 0 {
			return true, nil
		}
	}
	return false, nil
}

// rebuild takes the lock, waits for grants in flight, reads both lanes'
// topics and sets every missing counter; another instance's rebuild is
// waited for instead (and its summary is the zero one). progress, when
// not nil, hears of the records read every 10,000.
func (r *rebuilder) rebuild(ctx context.Context, progress func(records int)) (RebuildSummary, error) {
	in := r.in
	lock := in.cfg.Namespace + "wrebuild-lock"
	mark := make([]byte, 8)
	_, _ = rand.Read(mark)
	owner := hex.EncodeToString(mark)
	for {
		ok, err := in.cfg.Redis.SetNX(ctx, lock, owner, 5*time.Minute).Result()
		if err != nil {
			r.mRuns.With("failed").Inc()
			return RebuildSummary{}, err
		}
		if ok {
			break
		}
		// Another instance rebuilds: done when its lock is gone.
		select {
		case <-ctx.Done():
			return RebuildSummary{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if n, err := in.cfg.Redis.Exists(ctx, lock).Result(); err == nil && n == 0 {
			if missing, err := in.countersMissing(ctx); err == nil && !missing {
				return RebuildSummary{}, nil
			}
		}
	}
	defer releaseClaimScript.Run(context.WithoutCancel(ctx), in.cfg.Redis, []string{lock}, owner)
	began := time.Now()
	in.cfg.Log.Warn("wallet: budget or stock counters missing from Redis; rebuilding them from the topics (grants that need them answer 503 meanwhile)",
		"settle", in.cfg.RebuildSettle)
	select {
	case <-ctx.Done():
		return RebuildSummary{}, ctx.Err()
	case <-time.After(in.cfg.RebuildSettle):
	}
	tree := in.cfg.Source.Tree()
	pipe := in.cfg.Redis.Pipeline()
	var sum RebuildSummary
	counted := func() { // every record read, of both lanes
		if sum.Records++; progress != nil && sum.Records%10_000 == 0 {
			progress(sum.Records)
		}
	}
	for _, l := range []*lane{&in.live, &in.shadow} {
		s, err := r.sums(ctx, l, counted)
		if err != nil {
			r.mRuns.With("failed").Inc()
			return sum, err
		}
		sum.OrderClaims += s.claims
		for _, ph := range budgeted(tree) {
			in.tally.Init(ctx, pipe, l.budgetKey(ph.ID), s.budget[ph.ID])
		}
		for tpl, total := range stocked(tree) {
			l.stock.Restore(ctx, pipe, tpl, total, s.stock[tpl])
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		r.mRuns.With("failed").Inc()
		return sum, fmt.Errorf("wallet: write rebuilt counters: %w", err)
	}
	r.mRuns.With("done").Inc()
	sum.Counters, sum.Took = len(in.counterKeys()), time.Since(began)
	in.cfg.Log.Warn("wallet: counters rebuilt from the topics", "records", sum.Records, "order_claims", sum.OrderClaims, "took", sum.Took.Round(time.Millisecond))
	return sum, nil
}

// laneSums is what one lane's topics say was spent.
type laneSums struct {
	budget map[string]int64 // phase -> cents granted
	stock  map[string]int64 // coupon template -> units granted
	claims int              // order claims of coupons and pendants set again
}

// sums reads a lane's grants and tokens to their ends, each order once,
// calling counted for every record read.
func (r *rebuilder) sums(ctx context.Context, l *lane, counted func()) (laneSums, error) {
	s := laneSums{budget: map[string]int64{}, stock: map[string]int64{}}
	seen := map[uint64]struct{}{} // order numbers (hashed: a 10M-order rebuild fits in memory)
	add := func(g *pb.RewardGrant) {
		if g == nil {
			return
		}
		h := maphash.String(r.seed, g.OrderNo)
		if _, dup := seen[h]; dup {
			return // a grant published again (a retried produce) counts once
		}
		seen[h] = struct{}{}
		s.budget[g.ActivityId] += g.Amount
		if g.AwardType == pb.AwardType_COUPON && g.TemplateId != "" {
			s.stock[g.TemplateId] += g.Amount
		}
	}
	// A topic that does not exist (the shadow lane's, before any load
	// test) holds nothing.
	absent := func(err error) bool { return errors.Is(err, kerr.UnknownTopicOrPartition) }
	// Grants claimed by key (coupons, pendants) get their claims back, so
	// a retry after the loss is a duplicate, not a second take of budget
	// and stock; written as the topic is read, a pipeline at a time.
	claims := r.in.cfg.Redis.Pipeline()
	flush := func() error {
		if claims.Len() == 0 {
			return nil
		}
		_, err := claims.Exec(ctx)
		return err
	}
	now := r.in.cfg.Now()
	err := streams.ReadToEnd(ctx, r.in.cfg.Kafka, l.ns+schemas.TopicGrants, func(rec *kgo.Record) error {
		var g pb.RewardGrant
		if streams.Decode(rec, &g) != nil {
			return nil
		}
		counted()
		add(&g)
		if left := claimTTL - now.Sub(time.UnixMilli(g.AtMs)); left > 0 && g.OrderNo != "" {
			// As claim writes it; "rebuilt" for the batch, and the grant's
			// time, so a retry publishes it again (harmless: its
			// consumers take an order number once).
			claims.SetNX(ctx, l.claimKey(g.OrderNo), claimMark(g.ActivityId, "rebuilt", &g, g.AtMs), left)
			s.claims++
			if claims.Len() >= 5000 {
				return flush()
			}
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil && !absent(err) {
		return s, fmt.Errorf("wallet: read %s: %w", l.ns+schemas.TopicGrants, err)
	}
	err = streams.ReadToEnd(ctx, r.in.cfg.Kafka, l.ns+schemas.TopicTokens, func(rec *kgo.Record) error {
		var t pb.Token
		if streams.Decode(rec, &t) == nil {
			counted()
			add(t.Grant)
		}
		return nil
	})
	if err != nil && !absent(err) {
		return s, fmt.Errorf("wallet: read %s: %w", l.ns+schemas.TopicTokens, err)
	}
	return s, nil
}

// budgeted is every phase of the tree with a budget.
func budgeted(t *config.Tree) []config.Child {
	var out []config.Child
	for _, a := range t.Activities {
		for _, c := range a.Children {
			if c.Budget > 0 {
				out = append(out, c)
			}
		}
	}
	return out
}

// stocked is every stock-controlled coupon template of the tree, with its
// total stock (the first scene naming it).
func stocked(t *config.Tree) map[string]int64 {
	out := map[string]int64{}
	for _, a := range t.Activities {
		for _, sc := range a.Scenes {
			if _, ok := out[sc.Template]; !ok && sc.Template != "" && sc.Switches.StockControl {
				out[sc.Template] = sc.Stock
			}
		}
	}
	return out
}
