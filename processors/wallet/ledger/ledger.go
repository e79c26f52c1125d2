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
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"surge/processors/wallet/internal/tokencache"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/config"
	"surge/processors/wallet/internal/counter"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
	"surge/streams/metrics"
)

// Config configures the ledger.
type Config struct {
	streams.Env
	Dir    string
	Source *config.Source
	Keys   *token.Keyring
	Tokens *tokencache.Cache // the users' unbooked tokens (reads, forced booking)
	// Advertise is the address of this instance's API ("http://host:port"),
	// told to the other instances through the consumer group so they can
	// send it the reads of the users it owns (see Owner).
	Advertise string
	// InstanceID is this instance's stable id (processor.instance_id);
	// with it a restarted instance names itself as before.
	InstanceID string
	// Total receives the cumulative sum of booked grants per partition,
	// once a second (nil: not published). See package counter.
	Total *counter.Counter
	// ExpectedKeys sizes the filter of the store's keys (two per booking);
	// past it lookups of new order numbers slowly fall back to Pebble.
	// Default 8M (16 MiB).
	ExpectedKeys int
}

// Ledger is the booking processor and the read side.
type Ledger struct {
	cfg         Config
	db          *pebble.DB
	keys        *localstore.KeyFilter // keys the store may hold: most lookups are of new orders
	ledgerTopic string
	limit       *guard.Bucket

	mu       sync.Mutex   // guards staged and the handler
	commitMu sync.RWMutex // a batch's commit (store and balances) against reads
	// staged is the open batch's writes. It is not indexed (keeping a
	// skiplist of it cost more than it served): what the handler reads
	// back from its own batch is in stagedOrders and accts' staged
	// balances instead.
	staged       *pebble.Batch
	stagedOrders map[string]struct{} // entry keys written in the open batch
	checking     *batchCheck         // the batch's tokens, decoded and checked beside the handler
	seen         *token.Verified     // tokens verified on earlier reads
	booked       []*pb.Token         // tokens booked in the open batch (marked SUCCESS after commit)
	marks        chan []*pb.Token    // committed batches' tokens on their way to markBooked
	accts        *accounts

	// A partition's part of the store is rebuilt from wallet.ledger
	// whenever the partition is assigned: another instance may have booked
	// for its users since this one last owned it.
	restore                   *streams.Restorer
	owners                    *owners
	partitions                int
	rebuild                   *pebble.Batch
	rebuildAccts              *accounts
	ready                     atomic.Bool
	totals                    *totals
	Bookings, Forged, Refused atomic.Int64

	mBooked, mForged, mRefused metrics.Counter
	// Order lookups by how they were answered: by the key filter alone,
	// or by the store (found, or not: a false "maybe" of the filter; when
	// these grow, wallet.ledger_keys is too small).
	mLookupFilter, mLookupFound, mLookupMissed metrics.Counter
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.ExpectedKeys <= 0 {
		c.ExpectedKeys = 8 << 20
	}
}

// New returns a ledger.
func New(cfg Config) *Ledger {
	cfg.EnsureDefaults()
	c := cfg.Metrics.NewCounterVec("surge_wallet_ledger_total", "ledger events", "event")
	l := &Ledger{cfg: cfg, ledgerTopic: cfg.Namespace + schemas.TopicLedger, seen: token.NewVerified(1 << 20), limit: guard.NewBucket(cfg.Source.Tree().RateLimits.BookingsPerSecond),
		mBooked: c.With("booked"), mForged: c.With("forged_token"), mRefused: c.With("withdrawal_refused")}
	lk := cfg.Metrics.NewCounterVec("surge_wallet_ledger_order_lookups_total", "is-this-order-booked lookups by how they were answered", "answer")
	l.mLookupFilter, l.mLookupFound, l.mLookupMissed = lk.With("filter_absent"), lk.With("store_found"), lk.With("store_absent")
	return l
}

// resetStore forgets everything known about the store's contents: it is
// about to be rebuilt from wallet.ledger. Run calls it once the store is
// open; nothing reads the filter or the balances before (reads wait for
// ready).
func (l *Ledger) resetStore() {
	l.keys = localstore.NewKeyFilter(l.cfg.ExpectedKeys)
	l.accts = newAccounts(l.db, maxCachedAccounts, l.keys)
	l.totals = newTotals()
}

// withdrawalSchema tells withdrawals (and red packets' debits) from
// tokens in a batch the ledger checks ahead (check.go).
var withdrawalSchema = schemas.Of(&pb.Withdrawal{}).Name

// Keys: 'a' actID -> balance(8) income(8), written when the balance
// leaves the in-memory cache (accounts); 'e' actID 0x00 orderNo -> the
// entry as the flow list shows it (appendStoredEntry). The entry key is
// also the idempotency index ("is this order booked?"): one key per
// booking, not two. The flow list is sorted by time when it is read.
// Every key names its user, so a partition's part of the store can be
// found and dropped (keyActID).
func acctKey(act string) []byte { return append(append(make([]byte, 0, 1+len(act)), 'a'), act...) }

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
func entryKey(act, no string) []byte {
	k := make([]byte, 0, 2+len(act)+len(no))
	k = append(append(append(k, 'e'), act...), 0)
	return append(k, no...)
}

// isBooked reports whether the entry keyed k (entryKey) is in the store.
func (l *Ledger) isBooked(k []byte) (bool, error) {
	if !l.keys.MayContain(k) {
		l.mLookupFilter.Inc()
		return false, nil
	}
	_, c, err := l.db.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		l.mLookupMissed.Inc()
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c.Close()
	l.mLookupFound.Inc()
	return true, nil
}

// isBookedForBatch is isBooked as the handler sees it: the store and the
// open batch over it.
func (l *Ledger) isBookedForBatch(act, no string) (bool, error) {
	k := entryKey(act, no)
	if _, ok := l.stagedOrders[string(k)]; ok {
		return true, nil
	}
	return l.isBooked(k)
}

// apply writes one ledger entry into w (the staged batch, or the restore)
// and stages the account's new balance, promoted when w commits
// (commitBatch). It returns the entry's key.
func (l *Ledger) apply(w *pebble.Batch, accts *accounts, e *pb.LedgerEntry) ([]byte, error) {
	acc, err := accts.get(e.ActId)
	if err != nil {
		return nil, err
	}
	// The account's key goes into the filter while the account has no
	// income: every account with income had its key added by the entry
	// that gave it its first income (the filter is only ever replaced by
	// a rebuild, which applies every entry again). Adding it on every
	// booking cost a cache miss each. (The key reaches the store only
	// when the balance is evicted from memory; until then the filter's
	// "maybe" costs a lookup that finds nothing.)
	isNew := acc.income == 0
	acc.balance += e.Amount
	if e.Amount > 0 {
		acc.income += e.Amount
	}
	if e.Kind == pb.LedgerKind_GRANT {
		l.totals.add(w == l.rebuild, int32(streams.PartitionFor([]byte(e.ActId), l.partitions)), e.Amount)
	}
	accts.stage(e.ActId, acc)
	ek, ak := entryKey(e.ActId, e.OrderNo), acctKey(e.ActId)
	l.keys.Add(ek) // before the keys can be read
	if isNew {
		l.keys.Add(ak)
	}
	var v [3 * binary.MaxVarintLen64]byte
	return ek, w.Set(ek, appendStoredEntry(v[:0], e), nil)
}

// commitBatch commits w and then promotes the balances staged in accts
// beside it. The balances are not written into w: they stay in memory
// until evicted (accounts).
func (l *Ledger) commitBatch(w *pebble.Batch, accts *accounts) error {
	if err := w.Commit(pebble.NoSync); err != nil {
		return err
	}
	l.totals.commit(w == l.rebuild)
	return accts.commit()
}

// Run rebuilds the store from wallet.ledger and books until ctx ends.
func (l *Ledger) Run(ctx context.Context, opts ...streams.Option) error {
	db, err := localstore.Open(l.cfg.Dir, true, l.cfg.Log)
	if err != nil {
		return err
	}
	l.db = db
	defer db.Close()
	l.resetStore() // the store is rebuilt below, from nothing
	start := time.Now()
	n := 0
	if l.partitions, err = streams.PartitionCount(ctx, l.cfg.Kafka, l.cfg.Topic(schemas.TopicTokens)); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	l.restore = streams.NewRestorer(l.cfg.Kafka, l.clearPartitions, l.applyRestored, l.ledgerTopic)
	l.owners = &owners{kafka: l.cfg.Kafka, group: l.cfg.Namespace + "wallet-ledger", topic: l.cfg.Topic(schemas.TopicTokens),
		self: l.cfg.Advertise + "#" + cmp.Or(l.cfg.InstanceID, instanceNonce())}
	defer l.owners.close()
	l.restore.AfterAssign = l.owners.invalidate
	l.restore.AfterRebuild = l.finishRebuild
	// Partitions nobody wrote to after this point are not rebuilt again
	// when the group assigns them.
	if err := l.restore.Baseline(ctx); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	// The whole store, as a partition rebuild does it for one partition.
	l.startRebuild()
	err = streams.ReadToEnd(ctx, l.cfg.Kafka, l.ledgerTopic, func(r *kgo.Record) error {
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
	l.staged, l.stagedOrders = db.NewBatch(), map[string]struct{}{}
	l.ready.Store(true)
	opts = append([]streams.Option{
		streams.Kafka(l.cfg.Kafka),
		streams.Declare(Spec, l.cfg.Namespace), // group: l.owners.group
		streams.DeadLetterTopic(l.cfg.Topic(schemas.TopicDeadLetter)),
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer())), // co-partitioned by actID
		streams.OnBatchEnd(func(committed bool) { l.batchEnd(committed); l.checking.wait() }),
		streams.OnRetry(func() { l.batchEnd(false) }),
		streams.BeforeBatch(func(_ context.Context, recs []*kgo.Record) { l.checking = l.checkBatch(recs) }),
		l.restore.Option(),
		// Partitions without traffic are rebuilt too, so their reads can
		// be answered here.
		streams.OnIdle(func(ctx context.Context) {
			l.mu.Lock()
			defer l.mu.Unlock()
			if err := l.restore.EnsureAll(ctx); err != nil {
				l.cfg.Log.Warn("ledger: rebuilding idle partitions failed; retried when idle again", "err", err)
			}
		}),
		// A token has no failure state: a transient error (Redis, the
		// disk) is retried until it books, never dead-lettered.
		streams.MaxAttempts(math.MaxInt32),
	}, opts...)
	opts = append(opts, streams.ClientOpts(kgo.ClientID(advertisePrefix+l.owners.self)))
	route, err := streams.Route(Spec, l.cfg.Namespace, l.inputs()...)
	if err != nil {
		return err
	}
	r, err := streams.New("wallet-ledger", l.restore.Guard(&l.mu, route), opts...)
	if err != nil {
		return err
	}
	l.marks = make(chan []*pb.Token, 4)
	marked := make(chan struct{})
	go l.markBooked(marked)
	defer func() { close(l.marks); <-marked }()
	// The publisher outlives ctx until the runner has committed its last
	// batch, so its final publish includes it.
	published := make(chan struct{})
	pctx, stopPublishing := context.WithCancel(context.WithoutCancel(ctx))
	go l.publishTotals(pctx, published)
	defer func() { stopPublishing(); <-published }()
	return r.Run(ctx)
}

// markBooked moves committed bookings' tokens to SUCCESS in Redis, behind
// the processing goroutine: the status there only spares readers a store
// lookup (a token the ledger has booked is never counted twice), so the
// next batch need not wait for it. It was a third of a batch's time
// (bench/wallet-notes.md). A few batches may queue; then batchEnd waits.
func (l *Ledger) markBooked(done chan<- struct{}) {
	defer close(done)
	for toks := range l.marks {
		if l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := l.cfg.Tokens.MarkBooked(ctx, toks); err != nil {
			l.cfg.Log.Warn("ledger: token status not updated in Redis (reads still correct: the ledger says booked)", "err", err)
		}
		cancel()
	}
}

// publishTotals writes the committed sums of booked grants to the live
// total once a second, and once more when the ledger stops.
// FullPublishEvery is how many one-second publishes of changed sums pass
// between two publishes of all of them.
const FullPublishEvery = 30

func (l *Ledger) publishTotals(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	if l.cfg.Total == nil {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	ticks := 0
	publish := func(ctx context.Context) {
		if l.cfg.Source.Tree().Degraded(guard.Counter) {
			return // switched off: the sums are cumulative, they catch up when it is back on
		}
		// Every FullPublishEvery ticks every sum goes out, changed or not:
		// a Redis that missed writes (the primary, down while reads were
		// switched to the backup) is whole again within that time.
		var sums map[int32]int64
		if ticks++; ticks%FullPublishEvery == 0 {
			sums = l.totals.all()
		} else {
			sums = l.totals.dirty()
		}
		if err := l.cfg.Total.Publish(ctx, sums); err != nil {
			l.totals.redirty(sums)
			l.cfg.Log.Warn("ledger: live total not published; retried in a second", "err", err)
		}
	}
	publish(ctx) // the rebuilt sums, at once
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			publish(fctx)
			cancel()
			return
		case <-t.C:
			publish(ctx)
		}
	}
}

// clearPartitions drops the store's keys of the users in partitions ps.
func (l *Ledger) clearPartitions(ps map[int32]bool) error {
	// Balances live in memory until evicted: every cached balance goes to
	// the store (and leaves the cache) before the cleared partitions'
	// keys are deleted, so the others' survive and the cleared ones' are
	// rebuilt.
	if err := l.accts.flush(); err != nil {
		return err
	}
	if err := localstore.DeleteWhere(l.db, func(k []byte) bool {
		act := keyActID(k)
		return act != nil && ps[int32(streams.PartitionFor(act, l.partitions))]
	}); err != nil {
		return err
	}
	l.startRebuild()
	l.totals.clear(ps)
	return nil
}

// startRebuild opens the batch and balances a rebuild applies entries to.
func (l *Ledger) startRebuild() {
	l.rebuild, l.rebuildAccts = l.db.NewBatch(), newAccounts(l.db, maxCachedAccounts, l.keys)
}

// applyRestored books one entry of a rebuild (of a partition, or of the
// whole store at start) into the rebuild's own batch.
func (l *Ledger) applyRestored(r *kgo.Record) error {
	var e pb.LedgerEntry
	if streams.Decode(r, &e) != nil {
		return nil
	}
	if _, err := l.apply(l.rebuild, l.rebuildAccts, &e); err != nil {
		return err
	}
	if l.rebuild.Count() > 50000 {
		if err := l.commitBatch(l.rebuild, l.rebuildAccts); err != nil {
			return err
		}
		l.rebuild = l.db.NewBatch()
	}
	return nil
}

// finishRebuild commits the rebuild and hands its balances to the booking
// side's cache (which holds none of the rebuilt users: they were flushed
// out and dropped in clearPartitions, or the store is new).
func (l *Ledger) finishRebuild() error {
	err := l.commitBatch(l.rebuild, l.rebuildAccts)
	if err == nil {
		err = l.accts.adopt(l.rebuildAccts)
	}
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
		l.commitMu.Lock() // readers see the store and the balances of one commit
		if err := l.commitBatch(l.staged, l.accts); err != nil {
			l.cfg.Log.Error("ledger: pebble commit failed; exiting so the restart rebuilds it", "err", err)
			panic(err)
		}
		l.commitMu.Unlock()
		if l.cfg.Tokens != nil && len(toks) > 0 {
			l.marks <- toks
		}
	} else {
		_ = l.staged.Close()
		l.accts.drop()
		l.totals.drop()
	}
	l.staged = l.db.NewBatch()
	clear(l.stagedOrders)
}

// inputs are the ledger's inputs, each with its handler (Spec.Inputs).
func (l *Ledger) inputs() []streams.Input {
	return []streams.Input{
		streams.OnRecord(schemas.TopicTokens, l.onToken),
		streams.On(schemas.TopicWithdrawals, l.onWithdrawal),
		streams.On(schemas.TopicPackets, l.onPacketCredit),
	}
}

func (l *Ledger) onWithdrawal(ctx context.Context, _ *kgo.Record, w *pb.Withdrawal, out *streams.Output) error {
	return l.withdraw(ctx, w, out)
}

func (l *Ledger) onPacketCredit(_ context.Context, _ *kgo.Record, c *pb.PacketCredit, out *streams.Output) error {
	return l.credit(c, out)
}

// onToken books a token: checked ahead with its batch (check.go), or
// decoded and checked here.
func (l *Ledger) onToken(ctx context.Context, in *kgo.Record, out *streams.Output) error {
	if c, ok := l.checking.token(in); ok {
		_, err := l.book(ctx, c.tok, false, c.verdict, out)
		return err
	}
	var tok pb.Token
	if err := streams.Decode(in, &tok); err != nil {
		return err
	}
	if tok.Status == pb.TokenStatus_SUCCESS {
		return nil // a status update (earlier builds wrote them to wallet.tokens)
	}
	if tok.Status != pb.TokenStatus_PROCESSING {
		l.Forged.Add(1)
		l.mForged.Inc()
		return streams.Reject(fmt.Sprintf("token %s with status %s", tok.OutTradeNo, tok.Status), nil)
	}
	_, err := l.book(ctx, &tok, true, nil, out)
	return err
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
	done, err := l.isBookedForBatch(tok.ActId, tok.OutTradeNo)
	if err != nil || done {
		return false, err
	}
	l.limit.SetRate(l.cfg.Source.Tree().RateLimits.BookingsPerSecond)
	if err := l.limit.Wait(ctx, 1); err != nil {
		return false, err
	}
	acc, err := l.accts.get(tok.ActId)
	if err != nil {
		return false, err
	}
	e := &pb.LedgerEntry{OrderNo: tok.OutTradeNo, ActId: tok.ActId, Amount: tok.Amount, Kind: pb.LedgerKind_GRANT,
		BookedAtMs: time.Now().UnixMilli(), ActivityId: tok.ActivityId, SceneId: tok.SceneId, BalanceAfter: acc.balance + tok.Amount,
		GrantedAtMs: tok.OpenTime}
	// The entry on wallet.ledger is the token's move to SUCCESS: the
	// changelog of bookings, keyed like the token. The status in Redis
	// follows once the transaction commits (batchEnd).
	if err := l.bookEntry(e, out); err != nil {
		return false, err
	}
	l.booked = append(l.booked, tok)
	l.Bookings.Add(1)
	l.mBooked.Inc()
	return true, nil
}

// bookEntry stages e in the open batch and emits it to wallet.ledger,
// encoded once for both.
func (l *Ledger) bookEntry(e *pb.LedgerEntry, out *streams.Output) error {
	r := streams.NewEncodedRecord(l.ledgerTopic, []byte(e.ActId), e, marshalEntry(e))
	ek, err := l.apply(l.staged, l.accts, e)
	if err != nil {
		return err
	}
	l.stagedOrders[string(ek)] = struct{}{}
	out.Emit(r)
	return nil
}

// withdraw force-books the user's unbooked tokens, then books the
// withdrawal if the balance covers it; either way it answers on
// wallet.withdrawal-results. A withdrawal id is booked once. A red packet
// (ToActId set) is a withdrawal whose money goes to another user: its
// debit is booked the same way, and its credit goes to the receiver on
// wallet.packets in the same transaction.
func (l *Ledger) withdraw(ctx context.Context, w *pb.Withdrawal, out *streams.Output) error {
	answer := func(res *pb.Withdrawal) error {
		return out.EmitMsg(l.cfg.Topic(schemas.TopicWithdrawResult), []byte(w.ActId), res)
	}
	res := proto.Clone(w).(*pb.Withdrawal)
	what, orderNo, kind := "withdrawal", "w:"+w.WithdrawId, pb.LedgerKind_WITHDRAW
	if w.ToActId != "" {
		what, orderNo, kind = "red packet", "p:"+w.WithdrawId, pb.LedgerKind_P2P_PACKET
	}
	if w.WithdrawId == "" || w.ActId == "" || w.Amount <= 0 || w.ToActId == w.ActId {
		res.Refused, res.Reason = true, fmt.Sprintf("invalid %s: id %q, user %q, amount %d, to %q", what, w.WithdrawId, w.ActId, w.Amount, w.ToActId)
		return answer(res)
	}
	if done, err := l.isBookedForBatch(w.ActId, orderNo); err != nil || done {
		if done {
			res.Reason = "already booked"
			acc, _ := l.accts.get(w.ActId)
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
	acc, err := l.accts.get(w.ActId)
	if err != nil {
		return err
	}
	if acc.balance < w.Amount {
		l.Refused.Add(1)
		l.mRefused.Inc()
		res.Refused, res.Reason, res.BalanceAfter = true, fmt.Sprintf("over balance: %d requested, %d available", w.Amount, acc.balance), acc.balance
		return answer(res)
	}
	e := &pb.LedgerEntry{OrderNo: orderNo, ActId: w.ActId, Amount: -w.Amount, Kind: kind,
		BookedAtMs: time.Now().UnixMilli(), BalanceAfter: acc.balance - w.Amount}
	if err := l.bookEntry(e, out); err != nil {
		return err
	}
	if w.ToActId != "" {
		if err := out.EmitMsg(l.cfg.Topic(schemas.TopicPackets), []byte(w.ToActId), &pb.PacketCredit{PacketId: w.WithdrawId,
			FromActId: w.ActId, ToActId: w.ToActId, Amount: w.Amount, AtMs: e.BookedAtMs}); err != nil {
			return err
		}
	}
	res.BalanceAfter = e.BalanceAfter
	return answer(res)
}

// credit books a red packet's credit to its receiver, once per packet.
func (l *Ledger) credit(c *pb.PacketCredit, out *streams.Output) error {
	if c.PacketId == "" || c.ToActId == "" || c.Amount <= 0 {
		return streams.Reject(fmt.Sprintf("invalid red packet credit: id %q, to %q, amount %d", c.PacketId, c.ToActId, c.Amount), nil)
	}
	orderNo := "p:" + c.PacketId + ":in"
	if done, err := l.isBookedForBatch(c.ToActId, orderNo); err != nil || done {
		return err
	}
	acc, err := l.accts.get(c.ToActId)
	if err != nil {
		return err
	}
	return l.bookEntry(&pb.LedgerEntry{OrderNo: orderNo, ActId: c.ToActId, Amount: c.Amount, Kind: pb.LedgerKind_P2P_PACKET,
		BookedAtMs: time.Now().UnixMilli(), BalanceAfter: acc.balance + c.Amount}, out)
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
	if page < 0 || size <= 0 || page > len(items)/size { // also where page*size would overflow
		return nil, v, nil
	}
	lo := page * size
	return items[lo:min(lo+size, len(items))], v, nil
}

func (l *Ledger) read(ctx context.Context, actID string, flow bool) (View, []Item, error) {
	var v View
	if !l.ready.Load() {
		return v, nil, errors.New("ledger: store not rebuilt yet")
	}
	if p := l.partitionOf(actID); !l.servesPartition(ctx, p) {
		return v, nil, &NotOwnerError{Partition: p}
	}
	// The user's tokens first, then the store as one commit left it: a
	// token is then either in the booked balance or counted as unbooked,
	// never neither (a commit between reading the balance and asking
	// "booked?" used to drop a batch's tokens from the view).
	var toks []*pb.Token
	if l.cfg.Tokens != nil && !l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
		var bad int
		// Redis down: no tokens, and the view degrades to what is booked.
		toks, bad, _ = l.cfg.Tokens.All(ctx, actID)
		v.Forged += bad
	}
	var items []Item
	var unbooked []*pb.Token
	err := func() error {
		l.commitMu.RLock()
		defer l.commitMu.RUnlock()
		acc, err := l.accts.getCommitted(actID)
		if err != nil {
			return err
		}
		v.Balance, v.Income = acc.balance, acc.income
		if flow {
			lo := append(append([]byte{'e'}, actID...), 0)
			hi := append(append([]byte{'e'}, actID...), 1)
			it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
			if err != nil {
				return err
			}
			for ok := it.First(); ok; ok = it.Next() {
				if kind, amount, at, ok := parseStoredEntry(it.Value()); ok {
					items = append(items, Item{OrderNo: string(it.Key()[len(lo):]), Kind: kind, Amount: amount, AtMs: at, Booked: true})
				}
			}
			it.Close()
		}
		for _, tok := range toks {
			if tok.Status == pb.TokenStatus_SUCCESS {
				continue // marked once its booking committed: in the balance
			}
			if ok, _ := l.isBooked(entryKey(tok.ActId, tok.OutTradeNo)); ok {
				continue // booked; Redis not updated yet
			}
			unbooked = append(unbooked, tok)
		}
		return nil
	}()
	if err != nil {
		return v, nil, err
	}
	for _, tok := range unbooked {
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
	sort.SliceStable(items, func(a, b int) bool { return items[a].AtMs > items[b].AtMs })
	return v, items, nil
}
