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
	"surge/processors/wallet/internal/tokencache"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"

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
