package grant

// Order-number claims: each grant's order number claimed once in Redis, a
// duplicate answered with what the first grant got, and a failed batch's
// claims undone.

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
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
)

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
