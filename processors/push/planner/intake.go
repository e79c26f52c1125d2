package planner

// Intake: a job from push.jobs to its place in the queue (validation, the
// targets converged into a number package, the filter chain, the daily
// quota), or its refusal.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kadm"

	"surge/processors/push/filter"
	"surge/processors/push/internal/fanlist"
	"surge/processors/push/internal/quota"
	"surge/processors/push/numpkg"
	"surge/processors/timer"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

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
