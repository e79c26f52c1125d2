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
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kadm"
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

// refuse records a job's refusal: its state, a metric and a dead letter.
func (p *Planner) refuse(e emitter, j *pb.SendJob, to pb.JobState, why error) error {
	reason := why.Error()
	p.mRejected.With(strings.SplitN(reason, ":", 2)[0]).Inc()
	if err := e.move(j.JobId, to, reason, nil); err != nil {
		return err
	}
	return streams.RejectKeeping(fmt.Sprintf("job %s %s", j.JobId, strings.ToLower(to.String())), why)
}

func (p *Planner) intake(ctx context.Context, e emitter, j *pb.SendJob) error {
	if j.JobId == "" {
		return streams.Reject("job without a job id", nil)
	}
	if p.machine.Known(j.JobId) {
		p.mRejected.With("duplicate job id").Inc()
		return streams.Reject(fmt.Sprintf("duplicate job id %q (job is %s)", j.JobId, p.machine.State(j.JobId)), nil)
	}
	if j.CreatedAtMs == 0 {
		j.CreatedAtMs = e.now.UnixMilli()
	}
	if err := p.catchUpDirectory(ctx); err != nil {
		return err
	}
	if err := e.move(j.JobId, pb.JobState_CREATED, "", nil); err != nil {
		return err
	}
	if err := e.move(j.JobId, pb.JobState_VALIDATING, "", nil); err != nil {
		return err
	}
	acc, err := p.validate(j, e.now)
	if err != nil {
		return p.refuse(e, j, pb.JobState_REJECTED, err)
	}
	if err := e.move(j.JobId, pb.JobState_FETCHING_TARGETS, "", nil); err != nil {
		return err
	}
	targets, from, err := p.converge(ctx, j)
	if err != nil {
		if errors.Is(err, errTransient) {
			return err // retried, then dead-lettered by the runtime
		}
		return p.refuse(e, j, pb.JobState_FAILED, err)
	}
	uri, err := p.cfg.Packages.Put(ctx, j.JobId, targets)
	if err != nil {
		return fmt.Errorf("%w: store package: %v", errTransient, err)
	}
	j.PackageUri, j.InlinePackage = uri, nil
	n := targets.GetCardinality()
	p.countJob(j.AccountId, e.now)
	if err := e.move(j.JobId, pb.JobState_PACKAGE_READY, "targets from "+from, func(t *pb.JobTransition) {
		t.Job, t.Targets = j, n
	}); err != nil {
		return err
	}
	if j.ScheduledAtMs > e.now.UnixMilli() {
		rec, err := timer.Schedule(scheduleTimer(j.JobId), time.UnixMilli(j.ScheduledAtMs), p.cfg.Topic(schemas.TopicJobs), []byte(j.JobId), j)
		if err != nil {
			return err
		}
		rec.Topic = p.cfg.Topic(schemas.TopicTimers)
		e.out.Emit(rec)
		return e.move(j.JobId, pb.JobState_WAITING_SCHEDULE, "", func(t *pb.JobTransition) { t.Job, t.Targets = j, n })
	}
	return p.filterAndQueue(ctx, e, j, acc, targets)
}

// catchUpDirectory brings the directory up to every change committed on
// its topics before now, so a job sees what was published before it
// ("follow, then send"), whatever order the consumer reads the topics in.
func (p *Planner) catchUpDirectory(ctx context.Context) error {
	if p.lister == nil {
		cl, err := p.cfg.Kafka.NewClient()
		if err != nil {
			return fmt.Errorf("%w: directory lister: %v", errTransient, err)
		}
		p.lister = cl
	}
	n, err := p.cfg.Directory.CatchUp(ctx, p.cfg.Kafka, kadm.NewClient(p.lister))
	if err != nil {
		return fmt.Errorf("%w: %v", errTransient, err)
	}
	if n > 0 {
		p.mReadAhead.With().Add(float64(n))
	}
	return nil
}

// release is a job whose timer fired: a scheduled job at its time, or one
// waiting for quota at the next release.
func (p *Planner) release(ctx context.Context, e emitter, j *pb.SendJob) error {
	if st := p.machine.State(j.JobId); st != pb.JobState_WAITING_SCHEDULE && st != pb.JobState_WAITING_QUOTA {
		if st == pb.JobState_CANCELLED {
			return nil // cancelled while its timer was on its way
		}
		return streams.Reject(fmt.Sprintf("timer fired for job %s in state %s", j.JobId, st), nil)
	}
	if expired(j, e.now) {
		return e.move(j.JobId, pb.JobState_EXPIRED, "expired before its scheduled time came", nil)
	}
	acc, ok := p.cfg.Directory.Account(j.AccountId)
	if !ok {
		return p.refuse(e, j, pb.JobState_CANCELLED, fmt.Errorf("unknown account: %d vanished before the job's time", j.AccountId))
	}
	targets, err := p.cfg.Packages.Get(ctx, j.PackageUri)
	if err != nil {
		return fmt.Errorf("%w: read package: %v", errTransient, err)
	}
	return p.filterAndQueue(ctx, e, j, acc, targets)
}

var (
	errTransient      = errors.New("transient")
	errRestorePending = errors.New("planner: restore pending")
)

// countJob counts a job accepted for an account today (DailyJobs).
func (p *Planner) countJob(account uint64, at time.Time) {
	if day := at.Format("2006-01-02"); day != p.jobsDay {
		p.jobsDay, p.jobsToday = day, map[uint64]uint32{}
	}
	p.jobsToday[account]++
}

func (p *Planner) jobsSentToday(account uint64, now time.Time) uint32 {
	if now.Format("2006-01-02") != p.jobsDay {
		return 0
	}
	return p.jobsToday[account]
}

func (p *Planner) validate(j *pb.SendJob, now time.Time) (Account, error) {
	acc, ok := p.cfg.Directory.Account(j.AccountId)
	limit := acc.DailyJobs
	if last, ok := p.cfg.Directory.LastDelivery(j.AccountId); ok {
		limit = quota.AccountDailyJobs(acc.DailyJobs, last.Clicks, last.Targets, p.cfg.CTRMinTargets, p.cfg.TargetCTR)
	}
	switch {
	case !ok:
		return acc, fmt.Errorf("unknown account: %d", j.AccountId)
	case limit > 0 && p.jobsSentToday(j.AccountId, now) >= limit:
		return acc, fmt.Errorf("daily job limit: account %d sent its %d jobs today (base %d, by its last delivery's click-through)",
			j.AccountId, limit, acc.DailyJobs)
	case j.ContentId == "":
		return acc, errors.New("no content: content_id is empty")
	case j.ScheduledAtMs != 0 && j.ScheduledAtMs < now.UnixMilli():
		return acc, fmt.Errorf("scheduled in the past: %s is before %s",
			time.UnixMilli(j.ScheduledAtMs).UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case j.ScheduledAtMs != 0 && j.ScheduledAtMs < j.CreatedAtMs+p.cfg.MinLead.Milliseconds():
		return acc, fmt.Errorf("scheduled too soon: a scheduled job starts at least %s after creation", p.cfg.MinLead)
	case j.ExpiresAtMs != 0 && j.ExpiresAtMs <= max(now.UnixMilli(), j.ScheduledAtMs):
		return acc, fmt.Errorf("expired before it starts: expires_at %s", time.UnixMilli(j.ExpiresAtMs).UTC().Format(time.RFC3339))
	}
	switch j.Source {
	case pb.TargetSource_FOLLOWERS:
	case pb.TargetSource_PACKAGE:
		if j.PackageUri == "" && len(j.InlinePackage) == 0 {
			return acc, errors.New("no package: a PACKAGE job needs package_uri or inline_package")
		}
	case pb.TargetSource_TAGS:
		if len(j.Tags) == 0 {
			return acc, errors.New("no tags: a TAGS job needs at least one tag")
		}
	default:
		return acc, fmt.Errorf("unknown target source %d", j.Source)
	}
	return acc, nil
}

// converge turns any target source into one set: the job's package.
func (p *Planner) converge(ctx context.Context, j *pb.SendJob) (*roaring.Bitmap, string, error) {
	var set *roaring.Bitmap
	var from string
	var err error
	switch j.Source {
	case pb.TargetSource_FOLLOWERS:
		set, from, err = p.followers.Followers(ctx, j.AccountId)
		if errors.Is(err, fanlist.ErrUnknownAccount) {
			return nil, "", fmt.Errorf("unknown account: %w", err)
		}
		if err != nil {
			return nil, "", fmt.Errorf("%w: followers: %v", errTransient, err)
		}
	case pb.TargetSource_PACKAGE:
		from = "package"
		if len(j.InlinePackage) > 0 {
			set, err = numpkg.Decode(j.InlinePackage)
		} else {
			set, err = p.cfg.Packages.Get(ctx, j.PackageUri)
		}
		if errors.Is(err, numpkg.ErrNotFound) {
			// Not (yet) on push.packages: retried, then dead-lettered.
			return nil, "", fmt.Errorf("%w: %v", errTransient, err)
		}
		if err != nil {
			return nil, "", fmt.Errorf("bad package: %w", err)
		}
	case pb.TargetSource_TAGS:
		from = "tags"
		if set, err = p.cfg.Directory.Tags().Match(j.Tags); err != nil {
			return nil, "", err
		}
	}
	if set.IsEmpty() {
		return nil, "", fmt.Errorf("empty package: no targets from %s", from)
	}
	return set, from, nil
}

func (p *Planner) filterAndQueue(ctx context.Context, e emitter, j *pb.SendJob, acc Account, targets *roaring.Bitmap) error {
	if err := e.move(j.JobId, pb.JobState_FILTERING, "", nil); err != nil {
		return err
	}
	fj := &filter.Job{SendJob: j, Now: e.now, Followers: func(ctx context.Context) (*roaring.Bitmap, error) {
		s, _, err := p.followers.Followers(ctx, j.AccountId)
		return s, err
	}}
	res, err := p.chain.Run(ctx, fj, filter.Mask(j, acc.Filters), targets)
	if err != nil {
		return fmt.Errorf("%w: %v", errTransient, err)
	}
	// What each filter removed is reported, so deliveries reconcile with
	// the package: package = delivered + queued offline + filtered.
	if res.Kept.IsEmpty() {
		if waiting, err := p.awaitQuota(e, j, res); waiting || err != nil {
			return err
		}
	}
	for bit, removed := range res.Removed {
		if removed.IsEmpty() {
			continue
		}
		buf, err := removed.ToBytes()
		if err != nil {
			return err
		}
		if err := e.out.EmitMsg(p.cfg.Topic(schemas.TopicReports), []byte(j.JobId), &pb.DeliveryReport{JobId: j.JobId,
			Status: pb.DeliveryStatus_FILTERED, Filter: bit.String(), AtMs: e.now.UnixMilli(), Uins: buf, ContentId: j.ContentId}); err != nil {
			return err
		}
	}
	kept := res.Kept
	if kept.IsEmpty() {
		return e.move(j.JobId, pb.JobState_COMPLETED, "no targets left after filtering", nil)
	}
	fjob := proto_clone(j)
	uri, err := p.cfg.Packages.Put(ctx, j.JobId+".filtered", kept)
	if err != nil {
		return fmt.Errorf("%w: store filtered package: %v", errTransient, err)
	}
	fjob.PackageUri = uri
	if err := e.move(j.JobId, pb.JobState_QUEUED, "", func(t *pb.JobTransition) {
		t.Job, t.Targets = fjob, kept.GetCardinality()
	}); err != nil {
		return err
	}
	p.enqueue(fjob, kept, pb.JobState_QUEUED, e.now.UnixMilli())
	return p.dispatch(ctx, e)
}

// awaitQuota parks a job that got no quota at all because the current
// window has not released its unit yet (WAITING_QUOTA): it is filtered
// again at the day's next release, competing there with the jobs of that
// window, not with the ones that came before it. A job that some target
// could take, or that nothing released later today could help, does not
// wait. Nothing was charged: the quota filter runs last and took nobody,
// and the CRC filter marks only what was kept. Nothing is reported
// either: the next filtering reports what it removes.
func (p *Planner) awaitQuota(e emitter, j *pb.SendJob, res filter.Result) (bool, error) {
	refused := res.Removed[filter.Quota]
	if refused == nil || refused.IsEmpty() {
		return false, nil
	}
	next, ok := quota.NextRelease(e.now, p.cfg.QuotaSeed)
	if !ok {
		return false, nil
	}
	at := next
	if j.ExpiresAtMs != 0 && j.ExpiresAtMs < next.UnixMilli() {
		at = time.UnixMilli(j.ExpiresAtMs) // it expires first: it is ended then
	}
	rec, err := timer.Schedule(quotaTimer(j.JobId), at, p.cfg.Topic(schemas.TopicJobs), []byte(j.JobId), j)
	if err != nil {
		return false, err
	}
	rec.Topic = p.cfg.Topic(schemas.TopicTimers)
	e.out.Emit(rec)
	return true, e.move(j.JobId, pb.JobState_WAITING_QUOTA,
		fmt.Sprintf("no quota released yet in window %d for %d targets; next release at %s",
			quota.CurrentWindow(e.now, p.cfg.QuotaSeed)+1, refused.GetCardinality(), next.UTC().Format(time.RFC3339)), nil)
}

func (p *Planner) enqueue(j *pb.SendJob, kept *roaring.Bitmap, st pb.JobState, queuedAt int64) *queued {
	total := kept.GetCardinality()
	q := &queued{job: j, targets: kept, total: total, units: uint32((total + p.cfg.UnitSize - 1) / p.cfg.UnitSize),
		done: map[uint32]bool{}, state: st, executor: map[string]bool{}, queuedAt: queuedAt, holder: map[uint32]holding{}}
	p.queue[j.JobId] = q
	return q
}

func (p *Planner) observeLoad(l *pb.ExecutorLoad, now time.Time) {
	ev := p.executor(l.Executor)
	if len(l.Revoked) > 0 {
		p.takeBack(l.Executor, l.Revoked)
		return // a revocation, written by a planner: not a sign of life
	}
	if l.DoneJobId != "" {
		delete(ev.inflight, unitKey(l.DoneJobId, l.DoneUnitId))
		if q := p.queue[l.DoneJobId]; q != nil {
			q.markDone(l)
		}
		return // a completion, not a heartbeat
	}
	ev.load, ev.seen = l, now
}

// unitRef names one unit of one job.
type unitRef struct {
	job  string
	unit uint32
}

func unitKey(jobID string, unit uint32) unitRef { return unitRef{jobID, unit} }

func (u unitRef) String() string { return fmt.Sprintf("%s/%d", u.job, u.unit) }

// executor is the view of executor name, made on first mention.
func (p *Planner) executor(name string) *executorView {
	ev := p.executors[name]
	if ev == nil {
		ev = &executorView{inflight: map[unitRef]bool{}}
		p.executors[name] = ev
	}
	return ev
}

// free is how many more units an executor takes now: within the
// planner's backlog per executor and the capacity the executor reports
// (uins it takes at once; a smaller machine reports less), at least one
// unit in flight so any executor makes progress.
func (p *Planner) free(ev *executorView, now time.Time) int {
	if ev.load == nil || ev.load.Draining || now.Sub(ev.seen) > p.cfg.ExecutorTimeout || ev.revoked.After(ev.seen) {
		return 0
	}
	limit := p.cfg.MaxBacklog
	if c := ev.load.CapacityUins; c > 0 {
		limit = min(limit, max(int(c/p.cfg.UnitSize), 1))
	}
	return max(limit-len(ev.inflight), 0)
}

// dispatch hands out units by score while executors have room, finishes
// jobs whose units are all done, and marks pre-empted the jobs that were
// sending but lost their room to a higher score.
func (p *Planner) dispatch(_ context.Context, e emitter) error {
	jobs := make([]*queued, 0, len(p.queue))
	for _, q := range p.queue {
		jobs = append(jobs, q)
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].score() > jobs[b].score() })
	names := make([]string, 0, len(p.executors))
	room := map[string]int{}
	for name, ev := range p.executors {
		if f := p.free(ev, e.now); f > 0 {
			names = append(names, name)
			room[name] = f
		}
	}
	slices.Sort(names)
	for _, q := range jobs {
		if q.state == pb.JobState_PAUSED {
			continue // its dispatched units finish; nothing more goes out
		}
		if draining, err := p.drain(e, q); err != nil {
			return err
		} else if draining {
			continue // nothing more goes out until the draining executors finish its units
		}
		if q.next == q.units && len(q.redo) == 0 {
			if len(q.done) == int(q.units) {
				if err := p.finish(e, q); err != nil {
					return err
				}
			}
			continue
		}
		if expired(q.job, e.now) {
			if err := p.expire(e, q); err != nil {
				return err
			}
			continue // nothing more goes out
		}
		assigned, err := p.assign(e, q, names, room)
		if err != nil {
			return err
		}
		if assigned == 0 && q.state == pb.JobState_SENDING && !q.job.Realtime && p.busyWithHigher(q, jobs) {
			if err := e.move(q.job.JobId, pb.JobState_PREEMPTED, "executors busy with higher-score jobs", nil); err != nil {
				return err
			}
			q.state = pb.JobState_PREEMPTED
		}
	}
	return nil
}

// drain moves a sending job with units on a draining executor (one leaving
// for an upgrade, see executor.Drain) to DRAINING: those units finish
// there and nothing more of the job goes out meanwhile, so the hand-over
// to the executors that stay is clean. Once they are done it resumes
// (RESUMING, SENDING) and dispatch goes on from its position, on the
// executors that remain. It reports whether q is (still) draining.
func (p *Planner) drain(e emitter, q *queued) (bool, error) {
	id := q.job.JobId
	switch q.state {
	case pb.JobState_SENDING:
		x := p.drainingHolder(q)
		if x == "" {
			return false, nil
		}
		q.state = pb.JobState_DRAINING
		return true, e.move(id, pb.JobState_DRAINING, "executor "+x+" is draining: its units of the job finish first", func(t *pb.JobTransition) {
			t.Position, t.Targets = uint64(q.next), q.total
		})
	case pb.JobState_DRAINING:
		if p.drainingHolder(q) != "" {
			return true, nil
		}
		if err := e.move(id, pb.JobState_RESUMING, "drained", nil); err != nil {
			return false, err
		}
		q.state = pb.JobState_SENDING
		return false, e.move(id, pb.JobState_SENDING, "", func(t *pb.JobTransition) { t.Position, t.Targets = uint64(q.next), q.total })
	}
	return false, nil
}

// drainingHolder is a draining executor holding a unit of q not yet done
// ("" when none).
func (p *Planner) drainingHolder(q *queued) string {
	for name := range q.executor {
		ev := p.executors[name]
		if ev == nil || ev.load == nil || !ev.load.Draining {
			continue
		}
		for u := range q.next {
			if !q.done[u] && ev.inflight[unitKey(q.job.JobId, u)] {
				return name
			}
		}
	}
	return ""
}

// markDone records a unit's completion (once; a refusal is kept).
func (q *queued) markDone(l *pb.ExecutorLoad) {
	if q.done[l.DoneUnitId] {
		return
	}
	q.done[l.DoneUnitId] = true
	q.redo = slices.DeleteFunc(q.redo, func(u uint32) bool { return u == l.DoneUnitId })
	if l.DoneRefused {
		q.refused = append(q.refused, l.DoneUnitId)
	}
}

// finish ends a job whose units are all done: COMPLETED, or
// PARTIALLY_COMPLETED when an executor refused some, whose targets get
// their quota and CRC mark back (restore does the same from the
// transition's refused_units).
func (p *Planner) finish(e emitter, q *queued) error {
	delete(p.queue, q.job.JobId)
	if len(q.refused) == 0 {
		return e.move(q.job.JobId, pb.JobState_COMPLETED, "", func(t *pb.JobTransition) {
			t.Position, t.Targets = uint64(q.units), q.total
		})
	}
	refused := slices.Clone(q.refused)
	slices.Sort(refused)
	p.giveBackUnits(q.job, q.targets, refused, q.queuedAt, e.now)
	return e.move(q.job.JobId, pb.JobState_PARTIALLY_COMPLETED, fmt.Sprintf("%d of %d units refused by executors", len(refused), q.units),
		func(t *pb.JobTransition) { t.Position, t.Targets, t.RefusedUnits = uint64(q.units), q.total, refused })
}

// expired reports whether a job with a deadline is past it.
func expired(j *pb.SendJob, now time.Time) bool {
	return j.ExpiresAtMs != 0 && now.UnixMilli() >= j.ExpiresAtMs
}

// expire ends a job past its deadline that still had units to dispatch:
// EXPIRED when none went out, PARTIALLY_COMPLETED once those that did are
// done (until then it waits, dispatching nothing). Its targets never
// dispatched get their quota and CRC mark back (giveBack; restore does
// the same on these transitions).
func (p *Planner) expire(e emitter, q *queued) error {
	id := q.job.JobId
	why := "expired at " + time.UnixMilli(q.job.ExpiresAtMs).UTC().Format(time.RFC3339)
	switch {
	case q.next == 0 && (q.state == pb.JobState_QUEUED || q.state == pb.JobState_PREEMPTED):
		p.giveBack(q.job, q.targets, 0, q.queuedAt, e.now)
		delete(p.queue, id)
		return e.move(id, pb.JobState_EXPIRED, why+" before any unit went out", nil)
	case len(q.done)+len(q.redo) < int(q.next):
		return nil // units still out: their outcome is the job's
	}
	if q.state == pb.JobState_PREEMPTED {
		if err := e.move(id, pb.JobState_RESUMING, why, nil); err != nil {
			return err
		}
		if err := e.move(id, pb.JobState_SENDING, why, func(t *pb.JobTransition) { t.Position, t.Targets = uint64(q.next), q.total }); err != nil {
			return err
		}
	}
	// Units refused, and units taken back from a silent executor and not
	// sent again, reached nobody: their targets get their marks back too.
	unsent := slices.Sorted(slices.Values(append(slices.Clone(q.refused), q.redo...)))
	p.giveBack(q.job, q.targets, q.next, q.queuedAt, e.now)
	p.giveBackUnits(q.job, q.targets, unsent, q.queuedAt, e.now)
	delete(p.queue, id)
	return e.move(id, pb.JobState_PARTIALLY_COMPLETED, fmt.Sprintf("%s: %d of %d units sent", why, int(q.next)-len(unsent), q.units), func(t *pb.JobTransition) {
		t.Position, t.Targets, t.RefusedUnits = uint64(q.next), q.total, unsent
	})
}

// busyWithHigher reports whether a higher-score job is holding units.
func (p *Planner) busyWithHigher(q *queued, jobs []*queued) bool {
	for _, o := range jobs {
		if o == q {
			return false
		}
		if o.next > 0 && len(o.done) < int(o.next) {
			return true
		}
	}
	return false
}

// assign gives q as many units as the executors have room for, preferring
// one executor that can take all its remaining units.
func (p *Planner) assign(e emitter, q *queued, names []string, room map[string]int) (int, error) {
	remaining := len(q.redo) + int(q.units-q.next)
	var order []string
	for _, n := range names {
		if room[n] >= remaining {
			order = []string{n} // fits on one: use only it
			break
		}
	}
	if order == nil {
		order = slices.Clone(names)
		sort.SliceStable(order, func(a, b int) bool { return room[order[a]] > room[order[b]] })
	}
	type plan struct {
		executor string
		n        int
	}
	var plans []plan
	for _, n := range order {
		if remaining == 0 {
			break
		}
		if k := min(room[n], remaining); k > 0 {
			plans = append(plans, plan{n, k})
			remaining -= k
		}
	}
	if len(plans) == 0 {
		return 0, nil
	}
	id := q.job.JobId
	switch q.state {
	case pb.JobState_PREEMPTED:
		if err := e.move(id, pb.JobState_RESUMING, "", nil); err != nil {
			return 0, err
		}
	}
	if err := e.move(id, pb.JobState_DISPATCHING, "", nil); err != nil {
		return 0, err
	}
	// Units taken back from a silent executor go first, then new ones.
	var handed []*pb.UnitDispatch
	var used []string
	for _, pl := range plans {
		for range pl.n {
			k := q.next
			if len(q.redo) > 0 {
				k, q.redo = q.redo[0], q.redo[1:]
			} else {
				q.next++
			}
			handed = append(handed, &pb.UnitDispatch{UnitId: k, Executor: pl.executor})
		}
		room[pl.executor] -= pl.n
		q.executor[pl.executor] = true
		used = append(used, pl.executor)
		p.mUnits.With(pl.executor).Add(float64(pl.n))
	}
	q.state = pb.JobState_SENDING
	if err := e.move(id, pb.JobState_SENDING, "", func(t *pb.JobTransition) {
		t.Position, t.Executor, t.Targets, t.Dispatched = uint64(q.next), strings.Join(used, ","), q.total, handed
	}); err != nil {
		return 0, err
	}
	seq := p.seq // the SENDING step's: each unit names the dispatch it is
	for _, d := range handed {
		u, err := p.unit(q, d.UnitId, d.Executor)
		if err != nil {
			return 0, err
		}
		u.DispatchSeq = seq
		ev := p.executors[d.Executor]
		if err := e.out.EmitMsg(ev.load.UnitsTopic, []byte(id), u); err != nil {
			return 0, err
		}
		ev.inflight[unitKey(id, d.UnitId)] = true
		q.holder[d.UnitId] = holding{executor: d.Executor, seq: seq}
	}
	return len(handed), nil
}

// unit is the record of unit k of q for executor (unitSpan cuts it).
func (p *Planner) unit(q *queued, k uint32, executor string) (*pb.SendTaskUnit, error) {
	part, start, end, err := p.unitSpan(q.targets, k)
	if err != nil {
		return nil, err
	}
	buf, err := part.ToBytes()
	if err != nil {
		return nil, err
	}
	j := q.job
	return &pb.SendTaskUnit{JobId: j.JobId, UnitId: k, Executor: executor, PackageUri: j.PackageUri,
		RangeStart: start, RangeEnd: end, Count: part.GetCardinality(), ContentId: j.ContentId,
		DisplayAtMs: j.DisplayAtMs, Targets: buf, ContentCrc: j.ContentCrc, UnitsTotal: q.units,
		Realtime: j.Realtime, AccountId: j.AccountId}, nil
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
