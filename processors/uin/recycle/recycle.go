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
