// Package recycle is the recycle queue of seed 003: the step controller
// that takes a uin from a granted ticket to the allocation pool.
//
//	TICKET_GRANTED -> BAN -> (ban expires) BACKUP -> DELETE -> COOL_DOWN -> (cool-down ends) RELEASE
//	                  any step before BACKUP -> STOPPED (unbanned, logged in, ticket expired)
//	                  COOL_DOWN -> STOPPED (an operator's request: the uin is not to be pooled)
//
// Every step is a request on uin.recycle-requests naming the step it
// expects to follow (expected_prev); the controller applies it only when
// the uin's current step is that one (compare-and-set on the next step),
// and only for the uin's current ticket, which each step verifies and
// renews. An applied step is a record on uin.recycle-steps in the same
// Kafka transaction as its input's offset and its own effects (the next
// request, its timer, the backup, the deletion notice), so a step runs
// exactly once across crashes, and a duplicate request (a competing
// scheduler, a replay) loses the compare-and-set. uin.recycle-steps is the
// controller's changelog: its store is rebuilt from it, partition by
// partition, whenever it is assigned a partition.
//
// A record may carry many tickets of one partition (RecycleStep.batch):
// the controller applies each ticket's step on its own, as above, and
// answers with one record per kind of output (the applied steps, the next
// requests, a timer per due time) rather than one per ticket, so a stock
// recycle costs records per partition and step, not per uin. A single
// ticket's record is answered with single records, as before batches.
//
// Effects outside Kafka (deleting account data, freeing the uin, pooling
// it) are idempotent, because an aborted batch runs them again.
package recycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/timer"
	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// Policy is how long each category is banned and cooled down, and how
// long a ticket lives without being renewed.
type Policy struct {
	Ban       map[string]time.Duration
	CoolDown  map[string]time.Duration
	TicketTTL time.Duration
	// EndedRetention is how long a finished ticket (released or stopped)
	// stays the uin's state, recognising late duplicates of its requests;
	// older ones are dropped when state is rebuilt (every start and
	// partition assignment). Default 30 days; it must exceed TicketTTL (a
	// request older than that is refused as expired anyway).
	EndedRetention time.Duration
}

// DefaultPolicy follows the seed's orders of magnitude: a ban of up to a
// month, a cool-down of up to half a year.
func DefaultPolicy() Policy {
	return Policy{
		Ban:       map[string]time.Duration{recycling.Abandoned: 24 * time.Hour, recycling.Spam: 7 * 24 * time.Hour, recycling.Inactive: 30 * 24 * time.Hour},
		CoolDown:  map[string]time.Duration{recycling.Abandoned: 7 * 24 * time.Hour, recycling.Spam: 30 * 24 * time.Hour, recycling.Inactive: 180 * 24 * time.Hour},
		TicketTTL: 24 * time.Hour, EndedRetention: 30 * 24 * time.Hour,
	}
}

// Config configures the controller.
type Config struct {
	streams.Env
	Dir        string // Pebble directory (a cache, wiped on start)
	Accounts   *account.Store
	Pool       *pool.Central
	Policy     Policy
	Partitions int // of uin.recycle-requests (default: as the broker has it)
}

// Controller is the recycle step controller.
type Controller struct {
	cfg        Config
	committed  *committed // nil until Run opens it
	restore    *streams.Restorer
	partitions int // of uin.recycle-requests, co-partitioned with uin.usage

	mu          sync.Mutex // the handler, the batch hooks and reads
	staged      *store     // the batch in flight
	restored    *store     // a rebuild in progress
	prefetch    prefetched // Redis reads for the batch in flight
	effects     effects    // Redis writes of the batch in flight, made before it commits
	catchUp     usageCatchUp
	bansChecked time.Time // when keepBans last read the markers
	// appliedSteps counts the batch's applied steps by kind; they reach
	// surge_uin_recycle_steps_total only when the batch commits.
	appliedSteps map[pb.RecycleStepKind]int

	mApplied, mRefused metrics.CounterVec
	mBannedLogins      metrics.CounterVec
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Policy.Ban == nil {
		c.Policy = DefaultPolicy()
	}
	if c.Policy.EndedRetention <= c.Policy.TicketTTL {
		c.Policy.EndedRetention = max(30*24*time.Hour, 2*c.Policy.TicketTTL)
	}
}

// New returns a controller; Run starts it.
func New(cfg Config) *Controller {
	cfg.EnsureDefaults()
	c := &Controller{cfg: cfg,
		mApplied:      cfg.Metrics.NewCounterVec("surge_uin_recycle_steps_total", "recycle steps applied", "step"),
		mRefused:      cfg.Metrics.NewCounterVec("surge_uin_recycle_refused_total", "recycle requests not applied", "reason"),
		mBannedLogins: cfg.Metrics.NewCounterVec("surge_uin_banned_logins_total", "login attempts of accounts banned for recycling", "category"),
	}
	c.restore = streams.NewRestorer(cfg.Kafka, c.clearPartitions, c.applyChangelog,
		c.cfg.Topic(schemas.TopicRecycleSteps), c.cfg.Topic(schemas.TopicUsage))
	c.restore.InputsOf(c.group(), c.cfg.Topic(schemas.TopicUsage))
	c.restore.AfterRebuild = func() error { return c.restored.commit() }
	return c
}

// recentStatesSize bounds the states kept in memory: 2 generations of
// 100k, about 40 MB.
const recentStatesSize = 100_000

func (c *Controller) group() string { return c.cfg.Namespace + "uin-recycle" }

// Run serves until ctx ends.
func (c *Controller) Run(ctx context.Context, opts ...streams.Option) error {
	// A batch's uins must all be in its partition, the one whose logins
	// this instance holds; the check needs the topic's real count.
	c.partitions = c.cfg.Partitions
	if c.partitions == 0 {
		n, err := streams.PartitionCount(ctx, c.cfg.Kafka, c.cfg.Topic(schemas.TopicRecycleReqs))
		if err != nil {
			return fmt.Errorf("recycle: partitions of %s: %w", c.cfg.Topic(schemas.TopicRecycleReqs), err)
		}
		c.partitions = n
	}
	db, err := openDB(c.cfg.Dir, c.cfg.Log)
	if err != nil {
		return err
	}
	defer db.Close()
	c.mu.Lock()
	c.committed = newCommitted(db, recentStatesSize)
	c.staged, c.restored = newStore(c.committed), newStore(c.committed)
	c.restored.retention, c.restored.now = c.cfg.Policy.EndedRetention, c.cfg.Now
	c.mu.Unlock()
	opts = append([]streams.Option{
		streams.Kafka(c.cfg.Kafka),
		streams.Declare(Spec, c.cfg.Namespace), // group: c.group()
		streams.DeadLetterTopic(c.cfg.Topic(schemas.TopicDeadLetter)),
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer())), // requests and usage co-partitioned by uin
		streams.BeforeBatch(func(ctx context.Context, recs []*kgo.Record) { c.keepBans(ctx); c.prefetchBatch(ctx, recs) }),
		streams.OnIdle(c.keepBans),
		streams.BeforeCommit(c.applyEffects),
		streams.OnBatchEnd(c.batchEnd),
		streams.OnRetry(func() { c.batchEnd(false) }),
		c.restore.Option(),
	}, opts...)
	// Last, over any configured bound: Redis down delays a step, never
	// drops it.
	opts = append(opts, streams.MaxAttempts(math.MaxInt32))
	route, err := streams.Route(Spec, c.cfg.Namespace, c.inputs()...)
	if err != nil {
		return err
	}
	r, err := streams.New("uin-recycle", c.restore.Guard(&c.mu, route), opts...)
	if err != nil {
		return err
	}
	defer c.closeCatchUp()
	return r.Run(ctx)
}

func (c *Controller) batchEnd(committed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prefetch, c.effects = prefetched{}, effects{}
	c.catchUp.done = nil
	steps := c.appliedSteps
	c.appliedSteps = nil
	if committed {
		for k, n := range steps {
			c.mApplied.With(k.String()).Add(float64(n))
		}
	}
	if !committed {
		c.staged.discard()
		c.catchUp.next = nil // the logins noted are discarded: read them again
		return
	}
	if err := c.staged.commit(); err != nil {
		c.cfg.Log.Error("recycle: pebble commit failed; exiting so the restart rebuilds it", "err", err)
		panic(err)
	}
}

// clearPartitions drops the state of the uins in partitions ps.
func (c *Controller) clearPartitions(ps map[int32]bool) error {
	return c.committed.drop(func(uin []byte) bool { return ps[int32(streams.PartitionFor(uin, c.partitions))] })
}

// applyChangelog rebuilds state from one applied step or usage event.
func (c *Controller) applyChangelog(r *kgo.Record) error {
	switch r.Topic {
	case c.cfg.Topic(schemas.TopicRecycleSteps):
		steps, err := recycling.Decode(r)
		if err != nil {
			return nil // not a step: nothing to rebuild
		}
		for _, e := range steps {
			if validUin(e.Uin) == nil {
				c.restored.setState(e)
			}
		}
	default:
		var u pb.UsageEvent
		if streams.Decode(r, &u) != nil || validUin(u.Uin) != nil {
			return nil
		}
		c.restored.noteLogin(&u)
	}
	if c.restored.size() >= 100_000 {
		return c.restored.commit()
	}
	return nil
}

// LastLogin is the newest login of a uin as two independent sources saw
// it: the login service (auth) and the device records (device). The seed
// merges both so one corrupt source cannot get an active user recycled.
type LastLogin struct{ Auth, Device int64 }

// Newest is the later of the two.
func (l LastLogin) Newest() int64 { return max(l.Auth, l.Device) }

// State returns the uin's last ticket at its last applied step (nil: none).
func (c *Controller) State(uin uint32) (*pb.RecycleStep, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.committed == nil {
		return nil, errors.New("recycle: not running")
	}
	return newStore(c.committed).state(uin)
}

// LastLogin returns the controller's live login index entry of uin.
func (c *Controller) LastLogin(uin uint32) (LastLogin, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.committed == nil {
		return LastLogin{}, errors.New("recycle: not running")
	}
	return newStore(c.committed).login(uin)
}

// next is the only step that may follow each step (the queue's order).
var next = map[pb.RecycleStepKind]pb.RecycleStepKind{
	pb.RecycleStepKind_RECYCLE_STEP_UNSPECIFIED: pb.RecycleStepKind_TICKET_GRANTED,
	pb.RecycleStepKind_TICKET_GRANTED:           pb.RecycleStepKind_BAN,
	pb.RecycleStepKind_BAN:                      pb.RecycleStepKind_BACKUP,
	pb.RecycleStepKind_BACKUP:                   pb.RecycleStepKind_DELETE,
	pb.RecycleStepKind_DELETE:                   pb.RecycleStepKind_COOL_DOWN,
	pb.RecycleStepKind_COOL_DOWN:                pb.RecycleStepKind_RELEASE,
}

// stoppable: recycling stops only before anything is backed up or
// deleted, or during cool-down when a restore takes the uin back.
var stoppable = map[pb.RecycleStepKind]bool{
	pb.RecycleStepKind_TICKET_GRANTED: true,
	pb.RecycleStepKind_BAN:            true,
	pb.RecycleStepKind_COOL_DOWN:      true,
}

// deletedAt is when the uin's account was last deleted by recycling (0:
// never). Steps written before deleted_at_ms existed carry only their own
// time, which is later than the deletion: the safe side.
func deletedAt(cur *pb.RecycleStep) int64 {
	if cur == nil {
		return 0
	}
	if cur.DeletedAtMs != 0 {
		return cur.DeletedAtMs
	}
	switch cur.Step {
	case pb.RecycleStepKind_DELETE, pb.RecycleStepKind_COOL_DOWN, pb.RecycleStepKind_RELEASE:
		return cur.AtMs
	case pb.RecycleStepKind_STOPPED:
		if cur.ExpectedPrev == pb.RecycleStepKind_COOL_DOWN { // a restore took it back after the deletion
			return cur.AtMs
		}
	}
	return 0
}

func validUin(u uint64) error {
	if u == 0 || u > math.MaxUint32 {
		return streams.Reject(fmt.Sprintf("uin out of range: %d (uins are 1..%d)", u, uint32(math.MaxUint32)), nil)
	}
	return nil
}

// step is the work on one input record. What its tickets' steps produce
// for the topics the controller itself reads (the changelog, the next
// requests, their timers) is gathered and emitted by flush, one record per
// kind; what other services read per uin (backups, deletion notices, pool
// changes) is emitted at once.
type step struct {
	c   *Controller
	ctx context.Context
	out *streams.Output
	now time.Time

	applied  []*pb.RecycleStep // for uin.recycle-steps
	requests []*pb.RecycleStep // for uin.recycle-requests, now
	timed    []timedRequests   // for uin.recycle-requests, later
}

// timedRequests are requests due at one time, sent through one timer.
type timedRequests struct {
	what string // backup, release
	at   time.Time
	reqs []*pb.RecycleStep
}

// inputs are the controller's inputs, each with its handler
// (Spec.Inputs).
func (c *Controller) inputs() []streams.Input {
	return []streams.Input{
		streams.OnRecord(schemas.TopicRecycleReqs, c.onRequest),
		streams.OnRecord(schemas.TopicUsage, c.onUsage),
	}
}

// onUsage notes its offset before it decodes it: a record that does not
// decode is read past by the catch-up too.
func (c *Controller) onUsage(ctx context.Context, in *kgo.Record, out *streams.Output) error {
	c.noteUsageOffset(in.Partition, in.Offset)
	var u pb.UsageEvent
	if err := streams.Decode(in, &u); err != nil {
		return err
	}
	s := &step{c: c, ctx: ctx, out: out, now: c.cfg.Now()}
	if err := s.usage(&u); err != nil {
		return err
	}
	return s.flush()
}

// onRequest takes a request decoded ahead by the prefetch, or decodes it.
func (c *Controller) onRequest(ctx context.Context, in *kgo.Record, out *streams.Output) error {
	req, ok := c.prefetch.decoded[in]
	if !ok { // a retry, after the prefetch was forgotten
		req = new(pb.RecycleStep)
		if err := streams.Decode(in, req); err != nil {
			return err
		}
	}
	s := &step{c: c, ctx: ctx, out: out, now: c.cfg.Now()}
	return s.record(in.Partition, req)
}

// record applies a request record: one ticket's step, or a batch's.
func (s *step) record(partition int32, req *pb.RecycleStep) error {
	c := s.c
	if err := c.checkPartition(partition, req); err != nil {
		return err
	}
	if needsLogins(req) {
		if err := c.catchUpUsage(s.ctx, partition); err != nil {
			return err // the broker: retried
		}
	}
	if len(req.Batch) == 0 {
		if err := s.request(req); err != nil {
			return err
		}
		return s.flush()
	}
	// A refused ticket does not hold back the others: the record goes to
	// the dead letters with the reasons, and what the others did is kept
	// (replayed, they lose the compare-and-set).
	var refused []string
	for _, e := range req.Batch {
		err := s.request(e)
		if streams.IsReject(err) {
			refused = append(refused, err.Error())
			c.mRefused.With("rejected").Inc()
			continue
		}
		if err != nil {
			return err
		}
	}
	if err := s.flush(); err != nil {
		return err
	}
	if len(refused) > 0 {
		return streams.RejectKeeping(fmt.Sprintf("%d of the batch's %d tickets refused; the first: %s", len(refused), len(req.Batch), refused[0]), nil)
	}
	return nil
}

// checkPartition refuses a request whose uins are not in the record's
// partition: this instance holds the logins of that partition's uins
// alone, and would judge another's without them.
func (c *Controller) checkPartition(partition int32, req *pb.RecycleStep) error {
	if len(req.Batch) > 0 && (req.Uin != 0 || req.TicketId != "" || req.Step != pb.RecycleStepKind_RECYCLE_STEP_UNSPECIFIED) {
		return streams.Reject("a batch with a ticket of its own", nil)
	}
	for _, e := range recycling.Entries(req) {
		if len(e.Batch) > 0 {
			return streams.Reject("a batch inside a batch", nil)
		}
		if err := validUin(e.Uin); err != nil {
			return err
		}
		if p := streams.PartitionFor(schemas.UinKey(uint32(e.Uin)), c.partitions); int32(p) != partition {
			return streams.Reject(fmt.Sprintf("uin %d belongs to partition %d, the record is on %d (key a record by its first uin)", e.Uin, p, partition), nil)
		}
	}
	return nil
}

// flush emits what the record's tickets gathered: their applied steps,
// the steps requested now, and a timer per due time, each as one record
// (a single ticket's as before batches, keyed by its uin; a batch keyed by
// its first uin, which puts it in the same partition).
func (s *step) flush() error {
	c := s.c
	if len(s.applied) > 0 {
		if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicRecycleSteps), recycling.Key(s.applied), recycling.Batch(s.applied)); err != nil {
			return err
		}
	}
	if len(s.requests) > 0 {
		if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicRecycleReqs), recycling.Key(s.requests), recycling.Batch(s.requests)); err != nil {
			return err
		}
	}
	for _, t := range s.timed {
		id := timerID(t.reqs[0].TicketId, t.what)
		if len(t.reqs) > 1 { // not the first ticket's own timer: stopping that ticket must not cancel it
			id = "recycle/batch/" + t.reqs[0].TicketId + "/" + t.what
		}
		rec, err := timer.Schedule(id, t.at, c.cfg.Topic(schemas.TopicRecycleReqs), recycling.Key(t.reqs), recycling.Batch(t.reqs))
		if err != nil {
			return err
		}
		rec.Topic = c.cfg.Topic(schemas.TopicTimers)
		s.out.Emit(rec)
	}
	s.applied, s.requests, s.timed = nil, nil, nil
	return nil
}

// usage keeps the login index and stops or monitors banned accounts.
func (s *step) usage(u *pb.UsageEvent) error {
	if err := validUin(u.Uin); err != nil {
		return err
	}
	c := s.c
	c.staged.noteLogin(u)
	cur, err := c.staged.state(uint32(u.Uin))
	if err != nil || ended(cur) {
		return err
	}
	if u.AtMs <= cur.LastLoginMs {
		return nil // the check already knew of it (usage is consumed late, and replayed)
	}
	switch u.Kind {
	case recycling.KindLogin, recycling.KindUnban:
		if cur.Step == pb.RecycleStepKind_TICKET_GRANTED || cur.Step == pb.RecycleStepKind_BAN {
			return s.stop(cur, fmt.Sprintf("%s at %d (%s) before backup", u.Kind, u.AtMs, u.Source))
		}
		if u.Kind == recycling.KindLogin {
			c.mBannedLogins.With(cur.Category).Inc()
		}
	case recycling.KindLoginRefused:
		c.mBannedLogins.With(cur.Category).Inc()
	}
	return nil
}

func (s *step) request(req *pb.RecycleStep) error {
	if err := validUin(req.Uin); err != nil {
		return err
	}
	c := s.c
	uin := uint32(req.Uin)
	cur, err := c.staged.state(uin)
	if err != nil {
		return err
	}
	if req.Step == pb.RecycleStepKind_TICKET_GRANTED {
		return s.grant(cur, req)
	}
	if cur == nil || cur.TicketId != req.TicketId {
		return streams.Reject(fmt.Sprintf("unknown ticket %q for uin %d", req.TicketId, uin), nil)
	}
	if req.ExpectedPrev != cur.Step {
		// Lost the compare-and-set: the step already ran (a duplicate
		// request, a competing scheduler) or is out of order.
		c.mRefused.With("cas_conflict").Inc()
		c.cfg.Log.Debug("recycle: compare-and-set lost", "uin", uin, "want", req.Step, "expected_prev", req.ExpectedPrev, "current", cur.Step)
		return nil
	}
	if req.Step == pb.RecycleStepKind_STOPPED {
		if !stoppable[cur.Step] {
			return streams.Reject(fmt.Sprintf("uin %d: cannot stop at %s", uin, cur.Step), nil)
		}
		return s.stop(cur, req.Reason)
	}
	if next[cur.Step] != req.Step {
		return streams.Reject(fmt.Sprintf("uin %d: %s cannot follow %s", uin, req.Step, cur.Step), nil)
	}
	if s.now.UnixMilli() > cur.TicketExpiresAtMs {
		return s.stop(cur, fmt.Sprintf("ticket expired at %d", cur.TicketExpiresAtMs))
	}
	switch req.Step {
	case pb.RecycleStepKind_BAN:
		return s.ban(cur)
	case pb.RecycleStepKind_BACKUP:
		return s.backup(cur)
	case pb.RecycleStepKind_DELETE:
		return s.delete(cur)
	case pb.RecycleStepKind_COOL_DOWN:
		return s.coolDown(cur)
	case pb.RecycleStepKind_RELEASE:
		return s.release(cur)
	}
	return streams.Reject("unhandled step "+req.Step.String(), nil)
}

// grant opens a ticket, after the last check of the login evidence: a
// login newer than the one the check saw means the check is stale.
func (s *step) grant(cur, req *pb.RecycleStep) error {
	c := s.c
	if _, ok := c.cfg.Policy.Ban[req.Category]; !ok {
		return streams.Reject(fmt.Sprintf("unknown category %q for uin %d", req.Category, req.Uin), nil)
	}
	if req.TicketId == "" {
		return streams.Reject(fmt.Sprintf("ticket grant for uin %d without a ticket id", req.Uin), nil)
	}
	if !ended(cur) {
		c.mRefused.With("ticket_open").Inc()
		return nil // another check granted it first; one ticket per uin
	}
	if deleted := deletedAt(cur); deleted != 0 && req.RegisteredAtMs <= deleted {
		// The account this check judged was deleted and its uin recycled:
		// a re-run of a classification over the same facts (ClickHouse
		// keeps the old registration rows). Quiet, like a lost
		// compare-and-set: the uin may be pooled, leased or handed out.
		c.mRefused.With("already_recycled").Inc()
		return nil
	}
	l, err := c.staged.login(uint32(req.Uin))
	if err != nil {
		return err
	}
	if l.Newest() > req.LastLoginMs {
		c.mRefused.With("logged_in_since_check").Inc()
		return s.apply(&pb.RecycleStep{Uin: req.Uin, TicketId: req.TicketId, Step: pb.RecycleStepKind_STOPPED,
			Category: req.Category, Username: req.Username, RegisteredAtMs: req.RegisteredAtMs, DeletedAtMs: deletedAt(cur),
			Reason: fmt.Sprintf("refused: logged in at %d (auth %d, device %d), after the check saw %d", l.Newest(), l.Auth, l.Device, req.LastLoginMs)})
	}
	g := &pb.RecycleStep{Uin: req.Uin, TicketId: req.TicketId, Step: pb.RecycleStepKind_TICKET_GRANTED,
		Category: req.Category, Username: req.Username, Reason: req.Reason, LastLoginMs: req.LastLoginMs,
		RegisteredAtMs: req.RegisteredAtMs, DeletedAtMs: deletedAt(cur), // the uin's last deletion stays the bound
		TicketExpiresAtMs: s.now.Add(c.cfg.Policy.TicketTTL).UnixMilli()}
	if err := s.apply(g); err != nil {
		return err
	}
	return s.requestNext(g, pb.RecycleStepKind_BAN)
}

func (s *step) ban(cur *pb.RecycleStep) error {
	until := s.now.Add(s.c.cfg.Policy.Ban[cur.Category])
	b := s.advance(cur, pb.RecycleStepKind_BAN, until)
	if err := s.apply(b); err != nil {
		return err
	}
	// The account is banned (logins refused) until the ban expires; written
	// before the batch commits (applyEffects).
	s.c.effects.bans = append(s.c.effects.bans, account.Ban{Uin: uint32(cur.Uin), Until: until, TicketID: cur.TicketId,
		Reason: "recycle: " + cur.Category})
	return s.schedule(b, "backup", until, pb.RecycleStepKind_BACKUP)
}

// backup checks, as the seed asks before any backup, that the account is
// still banned and has not logged in since the ban; then it writes the
// core data, keyed by username, to uin.backups.
func (s *step) backup(cur *pb.RecycleStep) error {
	c := s.c
	uin := uint32(cur.Uin)
	l, err := c.staged.login(uin)
	if err != nil {
		return err
	}
	if l.Newest() > cur.AtMs {
		return s.stop(cur, fmt.Sprintf("logged in at %d during the ban", l.Newest()))
	}
	b := s.advance(cur, pb.RecycleStepKind_BACKUP, time.Time{})
	bk, err := c.backupOf(s.ctx, uin)
	switch {
	case err != nil:
		return err
	case bk == nil:
		b.Reason = "no account data to back up"
	default:
		bk.BackedUpAtMs, bk.TicketId, bk.Category = s.now.UnixMilli(), cur.TicketId, cur.Category
		if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicBackups), []byte(bk.Username), bk); err != nil {
			return err
		}
		b.Username = bk.Username
	}
	if err := s.apply(b); err != nil {
		return err
	}
	return s.requestNext(b, pb.RecycleStepKind_DELETE)
}

func (s *step) delete(cur *pb.RecycleStep) error {
	c := s.c
	uin := uint32(cur.Uin)
	if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicDeletions), schemas.UinKey(uin), &pb.DeletionNotice{Uin: cur.Uin,
		Username: cur.Username, TicketId: cur.TicketId, Category: cur.Category, AtMs: s.now.UnixMilli()}); err != nil {
		return err
	}
	// The pool's journal: the uin is no longer used (its rebuild must not
	// count it as handed out once it is pooled again).
	free := &pb.PoolChange{Uin: cur.Uin, Op: pb.PoolChange_FREE, Bucket: c.cfg.Pool.Bucket(uin), AtMs: s.now.UnixMilli()}
	if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicPool), pool.BucketKey(free.Bucket), free); err != nil {
		return err
	}
	d := s.advance(cur, pb.RecycleStepKind_DELETE, time.Time{})
	d.DeletedAtMs = s.now.UnixMilli()
	if err := s.apply(d); err != nil {
		return err
	}
	// Written before the batch commits (applyEffects).
	c.effects.deletes = append(c.effects.deletes, account.Deletion{Uin: uin, Username: cur.Username})
	return s.requestNext(d, pb.RecycleStepKind_COOL_DOWN)
}

func (s *step) coolDown(cur *pb.RecycleStep) error {
	until := s.now.Add(s.c.cfg.Policy.CoolDown[cur.Category])
	cd := s.advance(cur, pb.RecycleStepKind_COOL_DOWN, until)
	if err := s.apply(cd); err != nil {
		return err
	}
	return s.schedule(cd, "release", until, pb.RecycleStepKind_RELEASE)
}

// release puts the uin into the central pool, unless a restore has taken
// it back (it is in use), in which case it stays out.
func (s *step) release(cur *pb.RecycleStep) error {
	c := s.c
	uin := uint32(cur.Uin)
	used, err := c.inUse(s.ctx, uin)
	if err != nil {
		return err
	}
	change := &pb.PoolChange{Uin: cur.Uin, Op: pb.PoolChange_INSERT, Bucket: c.cfg.Pool.Bucket(uin), AtMs: s.now.UnixMilli()}
	r := s.advance(cur, pb.RecycleStepKind_RELEASE, time.Time{})
	if used {
		change.Op, change.Reason = pb.PoolChange_REFUSED, fmt.Sprintf("uin in use: %d", uin)
		r.Reason = "not pooled: " + change.Reason
	} else {
		c.effects.releases = append(c.effects.releases, uin)
	}
	if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicPool), pool.BucketKey(change.Bucket), change); err != nil {
		return err
	}
	return s.apply(r)
}

// stop ends a ticket before anything irreversible, cancelling its timers.
func (s *step) stop(cur *pb.RecycleStep, reason string) error {
	if cur.Step == pb.RecycleStepKind_BAN { // recycling stops: so does its ban
		s.c.effects.unbans = append(s.c.effects.unbans, account.Ban{Uin: uint32(cur.Uin), TicketID: cur.TicketId})
	}
	for _, what := range []string{"backup", "release"} {
		cancel := timer.Cancel(timerID(cur.TicketId, what))
		cancel.Topic = s.c.cfg.Topic(schemas.TopicTimers)
		s.out.Emit(cancel)
	}
	st := s.advance(cur, pb.RecycleStepKind_STOPPED, time.Time{})
	st.Reason = reason
	return s.apply(st)
}

// advance is the record of the step after cur: same ticket, renewed.
func (s *step) advance(cur *pb.RecycleStep, to pb.RecycleStepKind, due time.Time) *pb.RecycleStep {
	renewed := s.now.Add(s.c.cfg.Policy.TicketTTL)
	if !due.IsZero() {
		renewed = due.Add(s.c.cfg.Policy.TicketTTL) // valid through the wait
	}
	n := &pb.RecycleStep{Uin: cur.Uin, TicketId: cur.TicketId, Step: to, ExpectedPrev: cur.Step,
		Category: cur.Category, Username: cur.Username, LastLoginMs: cur.LastLoginMs,
		RegisteredAtMs: cur.RegisteredAtMs, DeletedAtMs: cur.DeletedAtMs, TicketExpiresAtMs: renewed.UnixMilli()}
	if !due.IsZero() {
		n.DueAtMs = due.UnixMilli()
	}
	return n
}

// apply records an applied step: its changelog entry and the staged state.
func (s *step) apply(st *pb.RecycleStep) error {
	st.AtMs = s.now.UnixMilli()
	s.applied = append(s.applied, st)
	s.c.staged.setState(st)
	if s.c.appliedSteps == nil {
		s.c.appliedSteps = map[pb.RecycleStepKind]int{}
	}
	s.c.appliedSteps[st.Step]++
	return nil
}

// requestNext asks for the step after done, now.
func (s *step) requestNext(done *pb.RecycleStep, to pb.RecycleStepKind) error {
	s.requests = append(s.requests, recycling.Request(done, to))
	return nil
}

// schedule asks for the step after done at a time, through the timer
// service: with the other tickets due then, in one timer.
func (s *step) schedule(done *pb.RecycleStep, what string, at time.Time, to pb.RecycleStepKind) error {
	req := recycling.Request(done, to)
	for i := range s.timed {
		if t := &s.timed[i]; t.what == what && t.at.Equal(at) {
			t.reqs = append(t.reqs, req)
			return nil
		}
	}
	s.timed = append(s.timed, timedRequests{what: what, at: at, reqs: []*pb.RecycleStep{req}})
	return nil
}

func timerID(ticket, what string) string { return "recycle/" + ticket + "/" + what }
