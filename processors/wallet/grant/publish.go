package grant

// Tokens: signed in batches, encoded once, claimed in the users' hashes
// and published to wallet.tokens.

import (
	"context"
	"errors"
	"fmt"
	"surge/processors/wallet/internal/tokencache"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

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
