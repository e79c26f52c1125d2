// Package ledger books tokens into the account store and answers the
// user's reads. The account store is Pebble behind this processor: tokens
// and withdrawals arrive on wallet.tokens and wallet.withdrawals, both keyed
// by actID and co-partitioned, so one instance owns every write of a user
// and books them in order. Every booking is a record on wallet.ledger in
// the same Kafka transaction as the input's offset, so wallet.ledger is the
// store's changelog: Pebble is rebuilt from it on start, and a booking is
// idempotent by order number under any replay (the order number is the key
// of its entry, checked before booking).
//
// Booking throughput is limited by config (rate_limits.bookings_per_second)
// to model the seed's gap between grant peak and booking capacity; the
// user never sees that backlog, because reads add the unbooked tokens.
package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/guard"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
	"surge/streams/metrics"
)

// Config configures the ledger.
type Config struct {
	Namespace string
	Dir       string
	Source    *config.Source
	Keys      *token.Keyring
	Tokens    *grant.Tokens // the users' unbooked tokens (reads, forced booking)
	Log       *slog.Logger
	Metrics   *metrics.Registry
}

// Ledger is the booking processor and the read side.
type Ledger struct {
	cfg     Config
	brokers []string
	db      *pebble.DB
	limit   *guard.Bucket

	mu      sync.Mutex // guards staged and the handler
	staged  *pebble.Batch
	checked map[*kgo.Record]error // signature verdicts of the batch, computed in parallel
	seen    *token.Verified       // tokens verified on earlier reads
	booked  []*pb.Token           // tokens booked in the open batch (marked SUCCESS after commit)
	accts   *accounts

	// A partition's part of the store is rebuilt from wallet.ledger
	// whenever the partition is assigned: another instance may have booked
	// for its users since this one last owned it.
	restore                   *streams.Restorer
	partitions                int
	rebuild                   *pebble.Batch
	rebuildAccts              *accounts
	ready                     atomic.Bool
	Bookings, Forged, Refused atomic.Int64

	mBooked, mForged, mRefused metrics.Counter
}

// New returns a ledger.
func New(cfg Config, brokers []string) *Ledger {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewRegistry()
	}
	c := cfg.Metrics.NewCounterVec("surge_wallet_ledger_total", "ledger events", "event")
	return &Ledger{cfg: cfg, brokers: brokers, seen: token.NewVerified(1 << 20), accts: newAccounts(maxCachedAccounts), limit: guard.NewBucket(cfg.Source.Tree().RateLimits.BookingsPerSecond),
		mBooked: c.With("booked"), mForged: c.With("forged_token"), mRefused: c.With("withdrawal_refused")}
}

func (l *Ledger) topic(name string) string { return l.cfg.Namespace + name }

// Keys: 'o' actID 0x00 orderNo -> empty (the idempotency index); 'a'
// actID -> balance(8) income(8); 'e' actID 0x00 bookedAt(8) orderNo ->
// entry (flow). Every key names its user, so a partition's part of the
// store can be found and dropped (keyActID).
func orderKey(act, no string) []byte {
	return append(append(append([]byte{'o'}, act...), 0), no...)
}
func acctKey(act string) []byte { return append([]byte{'a'}, act...) }

// keyActID is the user a store key belongs to.
func keyActID(k []byte) []byte {
	if len(k) == 0 {
		return nil
	}
	if k[0] == 'a' {
		return k[1:]
	}
	if i := bytes.IndexByte(k[1:], 0); i >= 0 {
		return k[1 : 1+i]
	}
	return nil
}
func entryKey(act string, at int64, no string) []byte {
	k := append([]byte{'e'}, act...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(at))
	return append(k, no...)
}

func booked(r pebble.Reader, act, no string) (bool, error) {
	_, c, err := r.Get(orderKey(act, no))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.Close()
	return true, nil
}

// apply writes one ledger entry into w (the staged batch, or the restore)
// and stages the account's new balance.
func apply(w *pebble.Batch, accts *accounts, e *pb.LedgerEntry) error {
	acc, err := accts.get(w, e.ActId)
	if err != nil {
		return err
	}
	acc.balance += e.Amount
	if e.Amount > 0 {
		acc.income += e.Amount
	}
	accts.stage(e.ActId, acc)
	v, _ := proto.Marshal(e)
	// The order index only answers "booked?": an empty value keeps the
	// entry written once (the store is rebuilt from wallet.ledger anyway).
	_ = w.Set(orderKey(e.ActId, e.OrderNo), nil, nil)
	_ = w.Set(entryKey(e.ActId, e.BookedAtMs, e.OrderNo), v, nil)
	return w.Set(acctKey(e.ActId), binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(acc.balance)), uint64(acc.income)), nil)
}

// Run rebuilds the store from wallet.ledger and books until ctx ends.
func (l *Ledger) Run(ctx context.Context, opts ...streams.Option) error {
	db, err := localstore.Open(l.cfg.Dir, true, l.cfg.Log)
	if err != nil {
		return err
	}
	l.db = db
	defer db.Close()
	l.accts = newAccounts(maxCachedAccounts) // the store is rebuilt below; nothing cached may survive
	start := time.Now()
	n := 0
	if l.partitions, err = streams.PartitionCount(ctx, l.brokers, l.topic(schemas.TopicTokens)); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	l.restore = streams.NewRestorer(l.brokers, l.clearPartitions, l.applyRestored, l.topic(schemas.TopicLedger))
	l.restore.AfterRebuild = l.finishRebuild
	// Partitions nobody wrote to after this point are not rebuilt again
	// when the group assigns them.
	if err := l.restore.Baseline(ctx); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	// The whole store, as a partition rebuild does it for one partition.
	l.startRebuild()
	err = streams.ReadToEnd(ctx, l.brokers, l.topic(schemas.TopicLedger), func(r *kgo.Record) error {
		n++
		return l.applyRestored(r)
	})
	if err == nil {
		err = l.finishRebuild()
	}
	if err != nil {
		return fmt.Errorf("ledger: restore: %w", err)
	}
	l.cfg.Log.Info("ledger: store rebuilt from wallet.ledger", "entries", n, "took", time.Since(start).Round(time.Millisecond))
	l.staged = db.NewIndexedBatch()
	l.ready.Store(true)
	opts = append([]streams.Option{
		streams.Brokers(l.brokers...),
		streams.Inputs(l.topic(schemas.TopicTokens), l.topic(schemas.TopicWithdrawals)),
		streams.Group(l.cfg.Namespace + "wallet-ledger"),
		streams.WithGuarantee(streams.ExactlyOnce),
		streams.DeadLetterTopic(l.topic(schemas.TopicDeadLetter)),
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer())), // co-partitioned by actID
		streams.OnBatchEnd(l.batchEnd),
		streams.OnRetry(func() { l.batchEnd(false) }),
		streams.BeforeBatch(l.verifyBatch),
		l.restore.Option(),
		// A token has no failure state: a transient error (Redis, the
		// disk) is retried until it books, never dead-lettered.
		streams.MaxAttempts(math.MaxInt32),
	}, opts...)
	r, err := streams.New("wallet-ledger", l.Handle(), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// verifyBatch checks the signatures of a batch's tokens on every core;
// Ed25519 verification is most of a booking's cost.
func (l *Ledger) verifyBatch(_ context.Context, recs []*kgo.Record) {
	verdicts := make([]error, len(recs))
	done := make([]bool, len(recs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(recs) {
					return
				}
				var tok pb.Token
				if streams.Decode(recs[i], &tok) == nil && tok.Status == pb.TokenStatus_PROCESSING {
					verdicts[i], done[i] = l.cfg.Keys.Verify(&tok), true
				}
			}
		}()
	}
	wg.Wait()
	l.mu.Lock()
	l.checked = make(map[*kgo.Record]error, len(recs))
	for i, r := range recs {
		if done[i] { // only verdicts reached; the handler checks the rest itself
			l.checked[r] = verdicts[i]
		}
	}
	l.mu.Unlock()
}

// clearPartitions drops the store's keys of the users in partitions ps.
func (l *Ledger) clearPartitions(ps map[int32]bool) error {
	if err := localstore.DeleteWhere(l.db, func(k []byte) bool {
		act := keyActID(k)
		return act != nil && ps[int32(streams.PartitionFor(act, l.partitions))]
	}); err != nil {
		return err
	}
	l.accts.reset() // the cleared users' balances; reads do not refill it, only commits
	l.startRebuild()
	return nil
}

// startRebuild opens the batch and balances a rebuild applies entries to.
func (l *Ledger) startRebuild() {
	l.rebuild, l.rebuildAccts = l.db.NewIndexedBatch(), newAccounts(maxCachedAccounts)
}

// applyRestored books one entry of a rebuild (of a partition, or of the
// whole store at start) into the rebuild's own batch.
func (l *Ledger) applyRestored(r *kgo.Record) error {
	var e pb.LedgerEntry
	if streams.Decode(r, &e) != nil {
		return nil
	}
	if err := apply(l.rebuild, l.rebuildAccts, &e); err != nil {
		return err
	}
	if l.rebuild.Count() > 50000 {
		if err := l.rebuild.Commit(pebble.NoSync); err != nil {
			return err
		}
		l.rebuildAccts.commit()
		l.rebuild = l.db.NewIndexedBatch()
	}
	return nil
}

func (l *Ledger) finishRebuild() error {
	err := l.rebuild.Commit(pebble.NoSync)
	l.rebuild, l.rebuildAccts = nil, nil
	return err
}

// Ready reports whether the store has been rebuilt and reads are served.
func (l *Ledger) Ready() bool { return l.ready.Load() }

func (l *Ledger) batchEnd(committed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	toks := l.booked
	l.booked = nil
	if committed {
		if err := l.staged.Commit(pebble.NoSync); err != nil {
			l.cfg.Log.Error("ledger: pebble commit failed; exiting so the restart rebuilds it", "err", err)
			panic(err)
		}
		l.accts.commit()
		if l.cfg.Tokens != nil && !l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := l.cfg.Tokens.MarkBooked(ctx, toks); err != nil {
				l.cfg.Log.Warn("ledger: token status not updated in Redis (reads still correct: the ledger says booked)", "err", err)
			}
			cancel()
		}
	} else {
		_ = l.staged.Close()
		l.accts.drop()
	}
	l.staged = l.db.NewIndexedBatch()
}

// Handle is the handler over wallet.tokens and wallet.withdrawals.
func (l *Ledger) Handle() streams.Handler {
	return func(ctx context.Context, in *kgo.Record, out *streams.Output) error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if err := l.restore.Ensure(ctx, in.Partition); err != nil {
			return err
		}
		if name, _ := streams.Header(in, schemas.HeaderSchema); name == schemas.Of(&pb.Withdrawal{}).Name {
			var w pb.Withdrawal
			if err := streams.Decode(in, &w); err != nil {
				return err
			}
			return l.withdraw(ctx, &w, out)
		}
		var tok pb.Token
		if err := streams.Decode(in, &tok); err != nil {
			return err
		}
		if tok.Status == pb.TokenStatus_SUCCESS {
			return nil // our own status update
		}
		if tok.Status != pb.TokenStatus_PROCESSING {
			l.Forged.Add(1)
			l.mForged.Inc()
			return streams.Reject(fmt.Sprintf("token %s with status %s", tok.OutTradeNo, tok.Status), nil)
		}
		verdict, checked := l.checked[in]
		_, err := l.book(ctx, &tok, !checked, verdict, out)
		return err
	}
}

// book books one token unless its order number already is. It returns
// whether it booked.
func (l *Ledger) book(ctx context.Context, tok *pb.Token, verify bool, verdict error, out *streams.Output) (bool, error) {
	if verify {
		verdict = l.cfg.Keys.Verify(tok)
	}
	if err := verdict; err != nil {
		l.Forged.Add(1)
		l.mForged.Inc()
		return false, streams.Reject("token refused: "+tok.OutTradeNo, err)
	}
	if tok.Amount <= 0 {
		return false, streams.Reject(fmt.Sprintf("token %s with amount %d", tok.OutTradeNo, tok.Amount), nil)
	}
	done, err := booked(l.staged, tok.ActId, tok.OutTradeNo)
	if err != nil || done {
		return false, err
	}
	l.limit.SetRate(l.cfg.Source.Tree().RateLimits.BookingsPerSecond)
	if err := l.limit.Wait(ctx, 1); err != nil {
		return false, err
	}
	acc, err := l.accts.get(l.staged, tok.ActId)
	if err != nil {
		return false, err
	}
	e := &pb.LedgerEntry{OrderNo: tok.OutTradeNo, ActId: tok.ActId, Amount: tok.Amount, Kind: pb.LedgerKind_GRANT,
		BookedAtMs: time.Now().UnixMilli(), ActivityId: tok.ActivityId, SceneId: tok.SceneId, BalanceAfter: acc.balance + tok.Amount,
		GrantedAtMs: tok.OpenTime}
	if err := apply(l.staged, l.accts, e); err != nil {
		return false, err
	}
	if err := out.EmitMsg(l.topic(schemas.TopicLedger), []byte(e.ActId), e); err != nil {
		return false, err
	}
	done2 := proto.Clone(tok).(*pb.Token)
	done2.Status = pb.TokenStatus_SUCCESS
	if err := out.EmitMsg(l.topic(schemas.TopicTokens), []byte(e.ActId), done2); err != nil {
		return false, err
	}
	l.booked = append(l.booked, tok)
	l.Bookings.Add(1)
	l.mBooked.Inc()
	return true, nil
}

// withdraw force-books the user's unbooked tokens, then books the
// withdrawal if the balance covers it; either way it answers on
// wallet.withdrawal-results. A withdrawal id is booked once.
func (l *Ledger) withdraw(ctx context.Context, w *pb.Withdrawal, out *streams.Output) error {
	answer := func(res *pb.Withdrawal) error {
		return out.EmitMsg(l.topic(schemas.TopicWithdrawResult), []byte(w.ActId), res)
	}
	res := proto.Clone(w).(*pb.Withdrawal)
	if w.WithdrawId == "" || w.ActId == "" || w.Amount <= 0 {
		res.Refused, res.Reason = true, fmt.Sprintf("invalid withdrawal: id %q, user %q, amount %d", w.WithdrawId, w.ActId, w.Amount)
		return answer(res)
	}
	if done, err := booked(l.staged, w.ActId, "w:"+w.WithdrawId); err != nil || done {
		if done {
			res.Reason = "already booked"
			acc, _ := l.accts.get(l.staged, w.ActId)
			res.BalanceAfter = acc.balance
			return answer(res)
		}
		return err
	}
	if l.cfg.Tokens != nil && !l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
		toks, _, err := l.cfg.Tokens.All(ctx, w.ActId)
		if err != nil {
			return err // Redis down: retried, the withdrawal waits rather than misjudging the balance
		}
		for _, tok := range toks {
			if tok.Status != pb.TokenStatus_PROCESSING {
				continue
			}
			ok, err := l.book(ctx, tok, true, nil, out)
			if streams.IsReject(err) {
				continue // a forged token in Redis: counted, never booked
			}
			if err != nil {
				return err
			}
			if ok {
				res.ForceBooked++
			}
		}
	}
	acc, err := l.accts.get(l.staged, w.ActId)
	if err != nil {
		return err
	}
	if acc.balance < w.Amount {
		l.Refused.Add(1)
		l.mRefused.Inc()
		res.Refused, res.Reason, res.BalanceAfter = true, fmt.Sprintf("over balance: %d requested, %d available", w.Amount, acc.balance), acc.balance
		return answer(res)
	}
	e := &pb.LedgerEntry{OrderNo: "w:" + w.WithdrawId, ActId: w.ActId, Amount: -w.Amount, Kind: pb.LedgerKind_WITHDRAW,
		BookedAtMs: time.Now().UnixMilli(), BalanceAfter: acc.balance - w.Amount}
	if err := apply(l.staged, l.accts, e); err != nil {
		return err
	}
	if err := out.EmitMsg(l.topic(schemas.TopicLedger), []byte(w.ActId), e); err != nil {
		return err
	}
	res.BalanceAfter = e.BalanceAfter
	return answer(res)
}

// View is what a user sees: booked plus unbooked, so the backlog is
// invisible.
type View struct {
	Balance, Income int64
	Unbooked        int // tokens not yet booked, included above
	Forged          int // tokens refused by the signature check
}

// Item is one line of the flow list.
type Item struct {
	OrderNo string
	Kind    pb.LedgerKind
	Amount  int64
	AtMs    int64
	Booked  bool
}

// Balance returns the user's balance and total income.
func (l *Ledger) Balance(ctx context.Context, actID string) (View, error) {
	v, _, err := l.read(ctx, actID, false)
	return v, err
}

// Flow returns one page of the user's flow list, newest first: booked
// entries (grants, withdrawals, person-to-person packets) and unbooked
// tokens merged.
func (l *Ledger) Flow(ctx context.Context, actID string, page, size int) ([]Item, View, error) {
	v, items, err := l.read(ctx, actID, true)
	if err != nil {
		return nil, v, err
	}
	lo := min(page*size, len(items))
	return items[lo:min(lo+size, len(items))], v, nil
}

func (l *Ledger) read(ctx context.Context, actID string, flow bool) (View, []Item, error) {
	var v View
	if !l.ready.Load() {
		return v, nil, errors.New("ledger: store not rebuilt yet")
	}
	acc, err := l.accts.getCommitted(l.db, actID)
	if err != nil {
		return v, nil, err
	}
	v.Balance, v.Income = acc.balance, acc.income
	var items []Item
	if flow {
		lo := append(append([]byte{'e'}, actID...), 0)
		hi := append(append([]byte{'e'}, actID...), 1)
		it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			return v, nil, err
		}
		for ok := it.First(); ok; ok = it.Next() {
			var e pb.LedgerEntry
			if proto.Unmarshal(it.Value(), &e) == nil {
				items = append(items, Item{OrderNo: e.OrderNo, Kind: e.Kind, Amount: e.Amount, AtMs: e.BookedAtMs, Booked: true})
			}
		}
		it.Close()
	}
	if l.cfg.Tokens != nil && !l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
		toks, bad, err := l.cfg.Tokens.All(ctx, actID)
		if err != nil {
			return v, items, nil // degrade: show what is booked
		}
		v.Forged += bad
		for _, tok := range toks {
			if tok.Status == pb.TokenStatus_SUCCESS {
				continue
			}
			if ok, _ := booked(l.db, tok.ActId, tok.OutTradeNo); ok {
				continue // booked; Redis not updated yet
			}
			if l.seen.Verify(l.cfg.Keys, tok) != nil || tok.ActId != actID {
				v.Forged++
				l.Forged.Add(1)
				l.mForged.Inc()
				continue
			}
			v.Balance += tok.Amount
			v.Income += tok.Amount
			v.Unbooked++
			if flow {
				items = append(items, Item{OrderNo: tok.OutTradeNo, Kind: pb.LedgerKind_GRANT, Amount: tok.Amount, AtMs: tok.OpenTime})
			}
		}
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].AtMs > items[b].AtMs })
	return v, items, nil
}
