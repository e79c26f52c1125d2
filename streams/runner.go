package streams

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams/metrics"
)

// Runner runs one processor: a handler between input and output topics.
type Runner struct {
	cfg     config
	handler Handler
	log     *slog.Logger

	attempts map[recordID]int // transient failures per input, cleared on commit
	out      Output
	declared map[string]bool // output topics found in the spec (checked once each)

	mIn, mOut, mDLQ, mCommitted, mAborted, mRetries, mRestarts metrics.Counter
	mBatchTime                                                 metrics.Histogram
	// Waits of a transaction's first request for the previous
	// transaction's end (txnCommitter.awaitPreviousEnd).
	mSettled metrics.Counter
	// Open transactions of departed instances this one fenced.
	mFenced metrics.Counter
	mLag    metrics.GaugeVec

	client atomic.Pointer[kgo.Client] // the session's, for readiness
}

type recordID struct {
	topic     string
	partition int32
	offset    int64
}

// New builds a runner; it does not connect until Run.
func New(name string, h Handler, opts ...Option) (*Runner, error) {
	cfg := defaults(name)
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case name == "":
		return nil, errors.New("streams: processor needs a name")
	case h == nil:
		return nil, errors.New("streams: processor needs a handler")
	case len(cfg.cluster.Seeds) == 0:
		return nil, errors.New("streams: no brokers configured")
	case len(cfg.inputs) == 0:
		return nil, errors.New("streams: no input topics")
	case cfg.maxBatch <= 0:
		return nil, errors.New("streams: max batch must be positive")
	case cfg.guarantee == ExactlyOnce && cfg.instanceID == "":
		return nil, errors.New("streams: exactly-once needs an instance id")
	}
	if err := cfg.checkInputs(); err != nil {
		return nil, err
	}
	reg := cfg.registry
	r := &Runner{
		cfg:        cfg,
		handler:    h,
		log:        cfg.logger.With("processor", name, "guarantee", cfg.guarantee.String()),
		attempts:   map[recordID]int{},
		declared:   map[string]bool{},
		mIn:        reg.NewCounterVec("surge_records_in_total", "input records processed and committed", "processor").With(name),
		mOut:       reg.NewCounterVec("surge_records_out_total", "output records produced and committed", "processor").With(name),
		mDLQ:       reg.NewCounterVec("surge_dead_letters_total", "input records sent to the dead-letter topic", "processor").With(name),
		mCommitted: reg.NewCounterVec("surge_batches_total", "batches by outcome", "processor", "outcome").With(name, "committed"),
		mAborted:   reg.NewCounterVec("surge_batches_total", "batches by outcome", "processor", "outcome").With(name, "aborted"),
		mRetries:   reg.NewCounterVec("surge_errors_total", "errors by kind", "processor", "kind").With(name, "handler_retry"),
		mRestarts:  reg.NewCounterVec("surge_errors_total", "errors by kind", "processor", "kind").With(name, "session_restart"),
		mSettled:   reg.NewCounterVec("surge_txn_settle_waits_total", "waits of a transaction's first request for the previous transaction to finish", "processor").With(name),
		mFenced:    reg.NewCounterVec("surge_txn_fenced_total", "open transactions of departed instances fenced", "processor").With(name),
		mLag:       reg.NewGaugeVec("surge_consumer_lag", "records behind the high watermark", "processor", "topic", "partition"),
		mBatchTime: reg.NewHistogramVec("surge_batch_duration_seconds", "time from a batch's first record to its commit (or abort)",
			metrics.LatencyBuckets, "processor").With(name),
	}
	return r, nil
}

// Run processes until ctx is cancelled, then finishes the batch in flight,
// commits it and leaves the group. Broker failures restart the session with
// back-off from the last commit; Run returns only on shutdown.
func (r *Runner) Run(ctx context.Context) error {
	remove := r.cfg.health.Add(fmt.Sprintf("processor %s (group %s, instance %s)", r.cfg.name, r.cfg.group, r.cfg.instanceID), r.ready)
	defer remove()
	backoff := r.cfg.backoffMin
	for {
		err := r.session(ctx)
		if ctx.Err() != nil {
			if r.cfg.static {
				r.leaveStatic()
			}
			r.log.Info("processor stopped")
			return nil
		}
		var undeclared *UndeclaredError
		if errors.As(err, &undeclared) {
			r.log.Error("processor stopped: it produced to an undeclared topic", "err", err)
			return err // a bug: restarting would do it again
		}
		r.mRestarts.Inc()
		r.log.Warn("session failed; restarting from the last commit", "err", err, "retry_in", backoff)
		if !sleep(ctx, jitter(backoff)) {
			return nil
		}
		backoff = min(backoff*2, r.cfg.backoffMax)
	}
}

// staticInstanceID is the group.instance.id of a static member.
func (r *Runner) staticInstanceID() string { return r.cfg.group + "-" + r.cfg.instanceID }

// leaveStatic takes this static member out of its group on a graceful
// stop. A static member does not leave when its client closes (so a
// restart after kill -9 takes its place back at once), which would leave
// its partitions unserved until the session timeout after a deliberate
// stop or scale-down; the explicit leave hands them over now.
func (r *Runner) leaveStatic() {
	cl, err := r.cfg.cluster.NewClient()
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).LeaveGroup(ctx, kadm.LeaveGroup(r.cfg.group).InstanceIDs(r.staticInstanceID()).Reason("graceful stop"))
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		r.log.Warn("static member did not leave its group; its partitions move after the session timeout", "err", err)
	}
}

// DefaultSessionTimeout is how long a group waits for a member that
// stopped heartbeating (kill -9, a lost machine) before its partitions
// move: franz-go's default is 45 s.
const DefaultSessionTimeout = 10 * time.Second

func (r *Runner) clientOpts() []kgo.Opt {
	opts := r.cfg.cluster.Opts(
		kgo.SessionTimeout(DefaultSessionTimeout), kgo.HeartbeatInterval(time.Second), // options given later win
		kgo.ClientID(r.clientID(r.cfg.instanceID)), // operators (and tests) tell the members apart
		kgo.ConsumerGroup(r.cfg.group),
		kgo.ConsumeTopics(r.cfg.inputs...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RecordDeliveryTimeout(r.cfg.deliveryTO),
		kgo.MaxBufferedRecords(max(2*r.cfg.maxBatch, 10000)),
		kgo.ProducerBatchMaxBytes(int32(max(r.cfg.maxRecordBytes+(64<<10), 1<<20))),
		kgo.RetryBackoffFn(func(n int) time.Duration {
			return jitter(min(r.cfg.backoffMin<<min(n, 10), r.cfg.backoffMax))
		}),
		kgo.WithLogger(kgoLogger{r.log}),
	)
	if r.cfg.static {
		opts = append(opts, kgo.InstanceID(r.staticInstanceID()))
	}
	if r.cfg.guarantee == ExactlyOnce {
		opts = append(opts,
			// Per group and instance: two processors of one name in
			// separate groups (executors, namespaces) must not fence
			// each other.
			kgo.TransactionalID(r.txnID()),
			// A produce franz-go retries after a metadata refresh (a
			// moved leader; CONCURRENT_TRANSACTIONS that got through
			// awaitPreviousEnd) waits 250 ms for it, not the default 5 s.
			kgo.MetadataMinAge(250*time.Millisecond),
			kgo.TransactionTimeout(r.cfg.txnTimeout),
		)
	} else {
		opts = append(opts, kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
	}
	return append(opts, r.cfg.clientOpts...)
}

// session is one client lifetime.
func (r *Runner) session(ctx context.Context) error {
	if r.cfg.guarantee == ExactlyOnce {
		sess, err := kgo.NewGroupTransactSession(r.clientOpts()...)
		if err != nil {
			return err
		}
		defer sess.Close()
		if err := r.waitForBroker(ctx, sess.Client()); err != nil {
			return err
		}
		// Fence a dead predecessor under this transactional id now (a
		// restart after kill -9), not at the first batch: a standby gets
		// none, and the survivor that took over would wait out the dead
		// one's open transaction. See fence.go.
		if _, _, err := sess.Client().ProducerID(ctx); err != nil && ctx.Err() == nil {
			if r.cfg.onSession != nil {
				return fmt.Errorf("initialise the producer id: %w", err) // the hook needs its predecessors fenced
			}
			r.log.Warn("could not initialise the producer id; the first transaction will", "err", err)
		}
		if err := r.startSession(ctx); err != nil {
			return err
		}
		fctx, stopFencer := context.WithCancel(ctx)
		defer stopFencer()
		go (&orphanFencer{cl: sess.Client(), adm: kadm.NewClient(sess.Client()), group: r.cfg.group, own: r.txnID(),
			clientID: r.clientID, log: r.log, fenced: r.mFenced}).run(fctx)
		return r.loop(ctx, sess.Client(), &txnCommitter{s: sess, adm: kadm.NewClient(sess.Client()), txnID: r.txnID(), settled: r.mSettled, fault: r.cfg.fault})
	}
	cl, err := kgo.NewClient(r.clientOpts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	defer cl.AllowRebalance() // Close leaves the group, which is a rebalance
	if err := r.waitForBroker(ctx, cl); err != nil {
		return err
	}
	if err := r.startSession(ctx); err != nil {
		return err
	}
	return r.loop(ctx, cl, &offsetCommitter{cl: cl, fault: r.cfg.fault})
}

// startSession runs the OnSessionStart hook, if any.
func (r *Runner) startSession(ctx context.Context) error {
	if r.cfg.onSession == nil {
		return nil
	}
	if err := r.cfg.onSession(ctx); err != nil {
		return fmt.Errorf("session start: %w", err)
	}
	return nil
}

// waitForBroker pings until a broker answers, logging clearly while it does not.
func (r *Runner) waitForBroker(ctx context.Context, cl *kgo.Client) error {
	backoff := r.cfg.backoffMin
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := cl.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.log.Warn("no broker reachable; retrying", "kafka", r.cfg.cluster.String(), "err", err, "retry_in", backoff)
		if !sleep(ctx, jitter(backoff)) {
			return ctx.Err()
		}
		backoff = min(backoff*2, r.cfg.backoffMax)
	}
}

// ready is the runner's readiness: a session that has joined its group
// (a standby with no partitions is ready too) and whose ReadyWhen checks
// pass (a Restorer's: its partitions' state rebuilt).
func (r *Runner) ready(context.Context) error {
	cl := r.client.Load()
	if cl == nil {
		return errors.New("not connected to Kafka")
	}
	if _, gen := cl.GroupMetadata(); gen <= 0 {
		return fmt.Errorf("joining group %s", r.cfg.group)
	}
	for _, check := range r.cfg.readyChecks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// committer ends a batch: commit outputs and offsets, or abort.
type committer interface {
	begin() error
	produce(ctx context.Context, recs []*kgo.Record) error
	// commit returns false when the batch was aborted (rebalance) and will
	// be consumed again.
	commit(ctx context.Context) (bool, error)
	abort(ctx context.Context) error
	poll(ctx context.Context, n int) kgo.Fetches
}

func (r *Runner) loop(ctx context.Context, cl *kgo.Client, c committer) error {
	r.client.Store(cl)
	defer r.client.Store(nil)
	lctx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	go r.reportLag(lctx, cl)
	for {
		pctx, cancelPoll := ctx, context.CancelFunc(func() {})
		if r.cfg.onIdle != nil {
			pctx, cancelPoll = context.WithTimeout(ctx, idlePoll)
		}
		fetches := c.poll(pctx, r.cfg.maxBatch)
		cancelPoll()
		if fetches.IsClientClosed() {
			return errors.New("client closed")
		}
		var fetchErr error
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				fetchErr = fmt.Errorf("fetch %s/%d: %w", t, p, err)
			}
		})
		if fetchErr != nil {
			r.log.Warn("fetch error", "err", fetchErr)
		}
		recs := fetches.Records()
		if len(recs) == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if r.cfg.onIdle != nil {
				r.cfg.onIdle(ctx)
			}
			continue
		}
		r.observeLag(fetches)

		// The batch in flight finishes even when shutdown has begun.
		work, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.shutdownTO)
		began := time.Now()
		committed, err := r.runBatch(work, ctx, c, recs)
		r.mBatchTime.Since(began)
		cancel()
		if r.cfg.onBatchEnd != nil {
			r.cfg.onBatchEnd(committed && err == nil)
		}
		if err != nil {
			return err
		}
		if committed {
			clear(r.attempts)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (r *Runner) runBatch(work, ctx context.Context, c committer, recs []*kgo.Record) (bool, error) {
	if err := c.begin(); err != nil {
		return false, err
	}
	if r.cfg.beforeBatch != nil {
		r.cfg.beforeBatch(work, recs)
	}
	// Transient handler errors retry the batch in place (outputs are not
	// produced yet); process dead-letters a record once its attempts run out.
	dlq := 0
	retry := false
	ok := r.retryUntil(ctx, "handler (batch)", func() (err error) {
		if retry && r.cfg.onRetry != nil {
			r.cfg.onRetry() // forget what the failed attempt staged
		}
		retry = true
		if dlq, err = r.process(work, recs); err == nil && r.cfg.afterBatch != nil {
			err = r.cfg.afterBatch(work, &r.out)
		}
		return err
	})
	// A sink's write is retried alone (the handler already ran) until it
	// succeeds or shutdown: a store that is down delays, never drops, rows.
	if ok && r.cfg.beforeCommit != nil {
		ok = r.retryUntil(ctx, "write before commit", func() error { return r.cfg.beforeCommit(work) })
	}
	if !ok {
		_ = c.abort(work)
		return false, ctx.Err()
	}
	if err := r.checkDeclared(); err != nil {
		_ = c.abort(work)
		return false, err
	}
	r.faultAt(FaultBeforeProduce)
	if err := c.produce(work, r.out.recs); err != nil {
		_ = c.abort(work)
		return false, fmt.Errorf("produce: %w", err)
	}
	r.faultAt(FaultAfterProduce)
	ok, err := c.commit(work)
	if err != nil {
		return false, fmt.Errorf("commit: %w", err)
	}
	if !ok {
		r.mAborted.Inc()
		r.log.Info("batch aborted (a rebalance, or the broker refused its offsets); it will be consumed again", "records", len(recs))
		return false, nil
	}
	r.mCommitted.Inc()
	r.mIn.Add(float64(len(recs)))
	r.mDLQ.Add(float64(dlq))
	r.mOut.Add(float64(len(r.out.recs) - dlq))
	if r.cfg.onCommit != nil {
		r.cfg.onCommit(len(recs), len(r.out.recs)-dlq)
	}
	return true, nil
}

// faultAt calls the crash tests' hook (Faults) at step p.
func (r *Runner) faultAt(p FaultPoint) {
	if r.cfg.fault != nil {
		r.cfg.fault(p)
	}
}

// checkDeclared refuses a batch with a record bound for a topic the
// processor's spec does not declare.
func (r *Runner) checkDeclared() error {
	return r.cfg.checkOutputs(func(yield func(string) bool) {
		for _, rec := range r.out.recs {
			if r.declared[rec.Topic] {
				continue
			}
			if !yield(rec.Topic) {
				return
			}
			r.declared[rec.Topic] = true
		}
	})
}

// retryUntil calls fn until it succeeds, backing off exponentially between
// failures; it returns false if ctx (shutdown) ends first.
func (r *Runner) retryUntil(ctx context.Context, what string, fn func() error) bool {
	backoff := r.cfg.backoffMin
	for {
		err := fn()
		if err == nil {
			return true
		}
		r.mRetries.Inc()
		r.log.Warn(what+" failed; retrying", "err", err, "retry_in", backoff)
		if !sleep(ctx, jitter(backoff)) {
			return false
		}
		backoff = min(backoff*2, r.cfg.backoffMax)
	}
}

// process runs the handler over a batch into r.out, dead-lettering what
// can never succeed. It returns the dead-letter count, or a transient error.
func (r *Runner) process(ctx context.Context, recs []*kgo.Record) (int, error) {
	r.out.reset()
	dlq := 0
	toDLQ := func(in *kgo.Record, reason string) {
		r.out.Emit(deadLetter(r.cfg.deadLetter, r.cfg.name, in, reason, r.cfg.maxRecordBytes))
		dlq++
	}
	for _, in := range recs {
		if r.cfg.maxRecordBytes > 0 && len(in.Value) > r.cfg.maxRecordBytes {
			toDLQ(in, fmt.Sprintf("oversized record: %d bytes > %d", len(in.Value), r.cfg.maxRecordBytes))
			continue
		}
		mark := len(r.out.recs)
		err := r.handler(ctx, in, &r.out)
		if err == nil {
			continue
		}
		var re *RejectError
		if errors.As(err, &re) {
			if !re.Keep {
				r.out.recs = r.out.recs[:mark]
			}
			toDLQ(in, err.Error())
			continue
		}
		r.out.recs = r.out.recs[:mark] // a failed record emits nothing
		id := recordID{in.Topic, in.Partition, in.Offset}
		r.attempts[id]++
		if r.attempts[id] >= r.cfg.maxAttempts {
			toDLQ(in, "retries exhausted: "+err.Error())
			continue
		}
		return 0, fmt.Errorf("%s/%d@%d: %w", in.Topic, in.Partition, in.Offset, err)
	}
	return dlq, nil
}

func (r *Runner) observeLag(f kgo.Fetches) {
	f.EachPartition(func(p kgo.FetchTopicPartition) {
		if n := len(p.Records); n > 0 {
			lag := p.HighWatermark - p.Records[n-1].Offset - 1
			r.mLag.With(r.cfg.name, p.Topic, strconv.Itoa(int(p.Partition))).Set(float64(max(lag, 0)))
		}
	})
}

// reportLag sets surge_consumer_lag, every lagEvery, for each partition
// the group assigned to this client, from the group's commits and the end
// offsets: partitions no fetch returned records of get their series too.
func (r *Runner) reportLag(ctx context.Context, cl *kgo.Client) {
	if r.cfg.lagEvery <= 0 {
		return
	}
	adm := kadm.NewClient(cl)
	t := time.NewTicker(r.cfg.lagEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		me, _ := cl.GroupMetadata()
		if me == "" {
			continue
		}
		lags, err := adm.Lag(ctx, r.cfg.group)
		if err != nil {
			continue
		}
		lags.Each(func(l kadm.DescribedGroupLag) {
			for topic, ps := range l.Lag {
				for p, m := range ps {
					if m.Member == nil || m.Member.MemberID != me || m.Err != nil || m.Lag < 0 {
						continue
					}
					r.mLag.With(r.cfg.name, topic, strconv.Itoa(int(p))).Set(float64(m.Lag))
				}
			}
		})
	}
}

// produceAll produces records asynchronously and waits for all of them.
func produceAll(ctx context.Context, produce func(context.Context, *kgo.Record, func(*kgo.Record, error)), recs []*kgo.Record) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	wg.Add(len(recs))
	for _, rec := range recs {
		produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
	}
	wg.Wait()
	return first
}

type txnCommitter struct {
	s     *kgo.GroupTransactSession
	adm   *kadm.Client // the session's client, for DescribeTransactions
	txnID string
	// produced is whether the open transaction has records; lastEnd is
	// when the previous one ended.
	produced bool
	lastEnd  time.Time
	// noDescribe is set once the broker refuses DescribeTransactions
	// (an old broker, or no DESCRIBE on the transactional id).
	noDescribe bool
	settled    metrics.Counter
	fault      func(FaultPoint)
}

func (t *txnCommitter) poll(ctx context.Context, n int) kgo.Fetches { return t.s.PollRecords(ctx, n) }
func (t *txnCommitter) begin() error                                { return t.s.Begin() }
func (t *txnCommitter) produce(ctx context.Context, recs []*kgo.Record) error {
	if len(recs) == 0 {
		return nil
	}
	t.awaitPreviousEnd(ctx)
	t.produced = true
	return produceAll(ctx, t.s.Produce, recs)
}

func (t *txnCommitter) commit(ctx context.Context) (bool, error) {
	if !t.produced {
		t.awaitPreviousEnd(ctx)
	}
	if t.fault != nil { // crash tests only (Faults)
		t.fault(FaultBeforeCommit)
		go t.fault(FaultDuringCommit)
	}
	ok, err := t.s.End(ctx, kgo.TryCommit)
	t.produced, t.lastEnd = false, time.Now()
	return ok, err
}

// settleWindow bounds how long after a transaction's end the next one
// checks that the end has finished.
const settleWindow = 2 * time.Second

// awaitPreviousEnd waits until the broker has finished the previous
// transaction (written its markers) before the next one sends its first
// request: its first produce, or, when it produced nothing, the commit of
// its offsets.
//
// Why: with transactions v2 (KIP-890, the default from Kafka 4.0) that
// first request also adds its partitions to the transaction, and the
// broker refuses it with CONCURRENT_TRANSACTIONS while the previous end is
// still being written. franz-go then
//   - on a TxnOffsetCommit, aborts the batch: it was consumed again, and a
//     processor that keeps memory (the push planner) rebuilt it from its
//     topics each time; a planner fed executor heartbeats (batches with
//     nothing to send) aborted dozens of times a minute, a second each;
//   - on a produce, retries after a metadata refresh, which waits out the
//     client's metadata minimum age (5 s by default): the ledger stalled
//     4-5 s in 3 of 4 runs of the wallet benchmark on a real broker, in
//     none of 12 with this wait (bench/wallet-notes.md).
//
// Asking for the transaction's state costs one round trip, and only right
// after an end.
func (t *txnCommitter) awaitPreviousEnd(ctx context.Context) {
	if t.noDescribe || t.lastEnd.IsZero() || time.Since(t.lastEnd) > settleWindow {
		return
	}
	deadline := t.lastEnd.Add(settleWindow)
	for {
		described, err := t.adm.DescribeTransactions(ctx, t.txnID)
		d := described[t.txnID]
		if err == nil {
			err = d.Err
		}
		if err != nil {
			// End anyway: at worst the batch is aborted and consumed again.
			t.noDescribe = errors.Is(err, kerr.UnsupportedVersion) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
			return
		}
		if !strings.HasPrefix(d.State, "Prepare") { // PrepareCommit, PrepareAbort, PrepareEpochFence
			return
		}
		t.settled.Inc()
		if time.Now().After(deadline) || !sleep(ctx, 5*time.Millisecond) {
			return
		}
	}
}
func (t *txnCommitter) abort(ctx context.Context) error {
	_, err := t.s.End(ctx, kgo.TryAbort)
	return err
}

type offsetCommitter struct {
	cl    *kgo.Client
	fault func(FaultPoint)
}

// poll blocks rebalances until the batch is committed (BlockRebalanceOnPoll),
// so a revoked partition never has its batch committed by the old owner.
func (o *offsetCommitter) poll(ctx context.Context, n int) kgo.Fetches {
	f := o.cl.PollRecords(ctx, n)
	if f.NumRecords() == 0 {
		o.cl.AllowRebalance() // nothing to commit; never hold the group up
	}
	return f
}
func (o *offsetCommitter) begin() error { return nil }
func (o *offsetCommitter) produce(ctx context.Context, recs []*kgo.Record) error {
	return produceAll(ctx, o.cl.Produce, recs)
}
func (o *offsetCommitter) commit(ctx context.Context) (bool, error) {
	defer o.cl.AllowRebalance()
	if o.fault != nil { // crash tests only (Faults)
		o.fault(FaultBeforeCommit)
		go o.fault(FaultDuringCommit)
	}
	if err := o.cl.CommitUncommittedOffsets(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// abort: outputs already produced stay (at-least-once); offsets are not
// committed, so the batch is consumed again by the next session.
func (o *offsetCommitter) abort(context.Context) error {
	o.cl.AllowRebalance()
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (r *Runner) txnID() string { return TransactionalID(r.cfg.group, r.cfg.instanceID) }

// TransactionalID is the transactional id of an exactly-once runner of
// group with instance id instance. Writing under it fences that instance:
// the push planner does so to take units back from a silent executor.
func TransactionalID(group, instance string) string { return group + "-" + instance }

// clientID is the client id of the group's member with instance id
// instance: how the fencer tells a live instance from a departed one.
func (r *Runner) clientID(instance string) string { return "surge-" + r.cfg.name + "-" + instance }

// kgoLogger forwards franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }
func (k kgoLogger) Log(level kgo.LogLevel, msg string, kv ...any) {
	if level == kgo.LogLevelError {
		k.l.Error("kafka: "+msg, kv...)
	} else {
		k.l.Warn("kafka: "+msg, kv...)
	}
}

// jitter is d spread over [d/2, d): instances that failed together (a
// broker restart) do not all retry at the same moment.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}
