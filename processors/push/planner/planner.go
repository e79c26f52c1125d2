// Package planner is the control plane of mass push. It takes send jobs
// from push.jobs, validates them, converges every target source into a
// number package, runs the filter chain, queues the job by score and
// dispatches it in units to executors by their reported load. Every step
// is a transition on push.job-transitions, written in the same Kafka
// transaction as the units it dispatches, so the topic is the whole truth:
// the planner's memory (job states, queue, CRC and quota state) is a cache
// rebuilt by replaying it (Restore), on start and after an aborted batch.
package planner

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/directory"
	"surge/processors/push/filter"
	"surge/processors/push/internal/fanlist"
	"surge/processors/push/internal/job"
	"surge/processors/push/internal/quota"
	"surge/processors/push/numpkg"
	"surge/processors/timer"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// Account is what the planner knows of a public account.
type Account = directory.Account

// Config holds the planner's rules and limits, and the stores it reads.
type Config struct {
	streams.Env
	UnitSize        uint64        // uins per unit (bounds an executor's memory per unit)
	MaxBacklog      int           // units an executor may hold not yet done
	MinLead         time.Duration // a scheduled job starts at least this long after creation
	ExecutorTimeout time.Duration // an executor silent this long gets nothing new
	// ReassignAfter: the units of an executor silent this long (killed,
	// its machine gone) are taken back and sent by others (reassign.go);
	// negative: never.
	ReassignAfter time.Duration
	QuotaSeed     uint64
	// TargetCTR is the click-through rate at which an account keeps its
	// base daily job quota; its last delivery's rate scales it (see
	// quota.AccountDailyJobs). CTRMinTargets: smaller deliveries do not count.
	TargetCTR     float64
	CTRMinTargets uint64
	// CheckpointEvery is how often the active planner checkpoints its
	// memory (push.planner-checkpoints) so a restore replays only the
	// transitions after it; 0 writes and reads none.
	CheckpointEvery time.Duration

	Packages numpkg.Store
	// Directory is the accounts, follower lists, tags and blacklists: views
	// of topics the planner consumes (and restores on assignment).
	Directory *directory.Directory
	// MirrorThreshold: accounts with this many followers are read from the
	// fan-list mirror when it validates (seed: 10M); 0 means never.
	MirrorThreshold uint64
}

// DefaultConfig is the seed's rules with limits sized for one machine.
func DefaultConfig() Config {
	return Config{UnitSize: 1 << 18, MaxBacklog: 8, MinLead: 15 * time.Minute,
		ExecutorTimeout: 5 * time.Second, ReassignAfter: 5 * time.Second, QuotaSeed: 1, TargetCTR: 0.05, CTRMinTargets: 100,
		CheckpointEvery: 30 * time.Second}
}

// EnsureDefaults fills what the Config left out: the limits without which
// nothing could be dispatched from DefaultConfig, and an empty directory.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	d := DefaultConfig()
	if c.UnitSize == 0 {
		c.UnitSize = d.UnitSize
	}
	if c.MaxBacklog == 0 {
		c.MaxBacklog = d.MaxBacklog
	}
	if c.ExecutorTimeout == 0 {
		c.ExecutorTimeout = d.ExecutorTimeout
	}
	if c.ReassignAfter == 0 {
		c.ReassignAfter = d.ReassignAfter
	}
	if c.Directory == nil {
		c.Directory = directory.New(c.Namespace)
	}
}

// queued is a job past filtering that still has units to send or finish.
type queued struct {
	job      *pb.SendJob // PackageUri is the filtered package
	targets  *roaring.Bitmap
	total    uint64
	units    uint32 // ceil(total / UnitSize)
	next     uint32 // next unit to dispatch
	done     map[uint32]bool
	state    pb.JobState
	executor map[string]bool // executors that hold units of it
	queuedAt int64           // ms, when it was queued (planner's clock)
	refused  []uint32        // units an executor refused (done, not sent)
	// holder is each dispatched unit's latest dispatch, as the
	// transitions tell it; redo are units taken back from a silent
	// executor, sent again before the next new one (reassign.go).
	holder map[uint32]holding
	redo   []uint32
}

func (q *queued) score() float64 {
	s := float64(q.job.Priority)*1e6 - float64(q.job.CreatedAtMs)/1e9
	if q.job.Realtime {
		s += 1e12 // real-time jobs come first and are never pre-empted
	}
	return s
}

type executorView struct {
	load     *pb.ExecutorLoad
	seen     time.Time
	inflight map[unitRef]bool // dispatched and not done
	// revoked: when its units were last taken back (reassign.go); it
	// gets nothing new until it reports again.
	revoked time.Time
}

// Planner is the processor. Its state is guarded by mu; the handler runs
// on the runner's goroutine, readers (tests, metrics) on others.
type Planner struct {
	cfg Config
	log *slog.Logger

	mu         sync.Mutex
	followers  *fanlist.Resolver
	jobsToday  map[uint64]uint32 // jobs accepted today per account (DailyJobs)
	jobsDay    string
	stale      bool // partitions were (re)assigned: restore before the next record
	machine    *job.Machine
	queue      map[string]*queued
	sent       *filter.Sent
	ledger     *quota.Ledger
	chain      *filter.Chain
	executors  map[string]*executorView
	restoreErr error
	illegal    int    // transitions a restore could not apply
	seq        uint64 // the last transition's JobTransition.seq

	ckpt         checkpoints
	restoreStats RestoreStats

	// lister lists the directory topics' end offsets for read-your-writes
	// (made on first use, closed when Run ends).
	lister *kgo.Client

	// Reassignment (reassign.go): runCtx is Run's, for the revocations it
	// writes; activeSince is when the memory was last restored (an
	// executor not heard from since counts as silent from then);
	// revoking is when each executor's last revocation began.
	runCtx      context.Context
	activeSince time.Time
	revoking    map[string]time.Time
	lastSweep   time.Time

	mUnits, mJobs, mRejected metrics.CounterVec
	mCheckpointBytes         metrics.GaugeVec
	mReadAhead               metrics.CounterVec
	mRevoked                 metrics.CounterVec
}

// New returns a planner.
func New(cfg Config) *Planner {
	cfg.EnsureDefaults()
	p := &Planner{cfg: cfg, log: cfg.Log}
	reg := cfg.Metrics
	p.mUnits = reg.NewCounterVec("surge_push_units_dispatched_total", "units dispatched", "executor")
	p.mJobs = reg.NewCounterVec("surge_push_job_transitions_total", "job transitions written", "to")
	p.mRejected = reg.NewCounterVec("surge_push_jobs_refused_total", "jobs refused", "reason")
	p.mCheckpointBytes = reg.NewGaugeVec("surge_push_planner_checkpoint_bytes", "size of the planner's last checkpoint")
	p.mReadAhead = reg.NewCounterVec("surge_push_directory_read_ahead_total", "directory records a job's intake read ahead of the consumer")
	p.mRevoked = reg.NewCounterVec("surge_push_units_revoked_total", "units taken back from a silent executor to be sent by others", "executor")
	p.revoking = map[string]time.Time{}
	p.reset()
	return p
}

func (p *Planner) reset() {
	p.machine = job.NewMachine()
	p.queue = map[string]*queued{}
	p.sent = filter.NewSent()
	p.ledger = quota.NewLedger(p.cfg.QuotaSeed)
	dir := p.cfg.Directory
	threshold := p.cfg.MirrorThreshold
	if threshold == 0 {
		threshold = math.MaxUint64
	}
	p.followers = &fanlist.Resolver{Source: dir.Followers(), Mirror: dir.Mirror(), Threshold: threshold}
	p.chain = filter.NewChain(filter.RelationFilter{}, dir.Blacklists(), dir.Tags(), p.sent, filter.QuotaFilter{Ledger: p.ledger})
	p.jobsToday, p.jobsDay = map[uint64]uint32{}, ""
	p.illegal = 0
	if p.executors == nil {
		p.executors = map[string]*executorView{}
	}
	for _, e := range p.executors {
		e.inflight = map[unitRef]bool{}
	}
}

// State returns a job's current state.
func (p *Planner) State(jobID string) pb.JobState { return p.machine.State(jobID) }

// Quota is the number of messages uin received today, per the planner.
func (p *Planner) Quota(uin uint32) int { return p.ledger.Count(p.cfg.Now(), uin) }

// Counts returns jobs per state.
func (p *Planner) Counts() map[pb.JobState]int { return p.machine.Count() }

// emitter collects the outputs of one input record.
type emitter struct {
	p   *Planner
	out *streams.Output
	now time.Time
}

func (e emitter) move(id string, to pb.JobState, reason string, fill func(*pb.JobTransition)) error {
	t, err := e.p.machine.Move(id, to)
	if err != nil {
		return err
	}
	t.AtMs = e.now.UnixMilli()
	e.p.seq = max(e.p.seq+1, uint64(t.AtMs)<<10)
	t.Seq = e.p.seq
	t.Reason = reason
	if fill != nil {
		fill(&t)
	}
	e.p.mJobs.With(to.String()).Inc()
	return e.out.EmitMsg(e.p.cfg.Topic(schemas.TopicJobTransitions), []byte(id), &t)
}

// inputs are the planner's inputs, each with its handler (Spec.Inputs):
// jobs, commands, executors' loads and the directory's topics.
func (p *Planner) inputs() []streams.Input {
	in := []streams.Input{
		streams.On(schemas.TopicJobs, p.onJob),
		streams.OnRecord(schemas.TopicJobCommands, p.onCommand),
		streams.On(schemas.TopicExecutors, p.onLoad),
	}
	for _, t := range directory.Inputs {
		in = append(in, streams.OnRecord(t, p.onDirectory))
	}
	return in
}

// guarded runs route with the lock held, once the planner's state is
// restored: after an assignment (stale: the previous owner's work is in
// the topics), an abort, or a restore that failed.
func (p *Planner) guarded(route streams.Handler) streams.Handler {
	return func(ctx context.Context, in *kgo.Record, out *streams.Output) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stale { // newly active: the previous owner's work is in the topics
			if err := p.cfg.Directory.Restore(ctx, p.cfg.Kafka); err != nil {
				return err
			}
			p.restoreErr = errRestorePending
			p.stale = false
		}
		if p.restoreErr != nil { // a rebuild is due (assignment, abort) or failed: try again
			if p.restoreErr = p.restore(ctx); p.restoreErr != nil {
				return p.restoreErr
			}
			p.log.Info("planner: restored", "queued", len(p.queue), "states", len(p.machine.Count()))
		}
		return route(ctx, in, out)
	}
}

// onJob takes a new job, or a scheduled one whose timer fired.
func (p *Planner) onJob(ctx context.Context, in *kgo.Record, j *pb.SendJob, out *streams.Output) error {
	e := emitter{p: p, out: out, now: p.cfg.Now()}
	if _, fired := streams.Header(in, timer.HeaderTimerID); fired {
		return p.release(ctx, e, j)
	}
	return p.intake(ctx, e, j)
}

func (p *Planner) onCommand(ctx context.Context, in *kgo.Record, out *streams.Output) error {
	return p.command(ctx, emitter{p: p, out: out, now: p.cfg.Now()}, in)
}

// onLoad takes an executor's load, then revokes the units of silent
// executors and dispatches what now fits.
func (p *Planner) onLoad(ctx context.Context, _ *kgo.Record, l *pb.ExecutorLoad, out *streams.Output) error {
	e := emitter{p: p, out: out, now: p.cfg.Now()}
	p.observeLoad(l, e.now)
	p.revokeSilent(e.now)
	return p.dispatch(ctx, e)
}

func (p *Planner) onDirectory(_ context.Context, in *kgo.Record, _ *streams.Output) error {
	return p.cfg.Directory.Apply(in)
}

// LiveExecutors is the number of executors that reported recently and
// are not draining.
func (p *Planner) LiveExecutors() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, now := 0, p.cfg.Now()
	for _, ev := range p.executors {
		if ev.load != nil && !ev.load.Draining && now.Sub(ev.seen) <= p.cfg.ExecutorTimeout {
			n++
		}
	}
	return n
}

// Queued is the number of jobs queued or sending.
func (p *Planner) Queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// Describe is a one-line view of a queued job's dispatch progress and the
// executors' in-flight units, for logs and failing tests.
func (p *Planner) Describe(jobID string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	if q := p.queue[jobID]; q != nil {
		fmt.Fprintf(&b, "%s: state %s, next %d of %d units, %d done, %d to send again;", jobID, q.state, q.next, q.units, len(q.done), len(q.redo))
	} else {
		fmt.Fprintf(&b, "%s: not queued (%s);", jobID, p.machine.State(jobID))
	}
	now := p.cfg.Now()
	for name, ev := range p.executors {
		var seen time.Duration
		if ev.load != nil {
			seen = now.Sub(ev.seen)
		}
		inflight := make([]string, 0, len(ev.inflight))
		for u := range ev.inflight {
			inflight = append(inflight, u.String())
		}
		slices.Sort(inflight)
		fmt.Fprintf(&b, " executor %s: %d in flight %v, free %d, seen %s ago;", name, len(ev.inflight), inflight, p.free(ev, now), seen.Round(time.Millisecond))
	}
	return b.String()
}
