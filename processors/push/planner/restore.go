package planner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/internal/job"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

func proto_clone(j *pb.SendJob) *pb.SendJob { return proto.Clone(j).(*pb.SendJob) }

// Restore rebuilds the planner's memory from the topics: the newest
// checkpoint (push.planner-checkpoints), then the transitions after its
// position (push.job-transitions; all of them when there is no checkpoint
// or the topic no longer holds what followed it): job states; the queue,
// with each job's dispatch position, from the jobs not yet finished; the
// CRC and quota state from the filtered package of every job queued since;
// unit completions from push.executors, from when the oldest job still
// queued was queued.
func (p *Planner) Restore(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restore(ctx)
}

// progress is what the transitions tell of a job not yet final.
type progress struct {
	job      *pb.SendJob
	position uint32
	queuedAt int64 // ms, planner's clock
	holders  map[uint32]holding
}

func (p *Planner) restore(ctx context.Context) error {
	kc := p.cfg.Kafka
	began := time.Now()
	p.reset()
	p.ckpt.next = nil // no checkpoint until the memory is whole again
	now := p.cfg.Now()
	jobs := map[string]*progress{}
	stats := RestoreStats{}
	// Only the planner writes the transitions, in its transactions.
	from := streams.ReplayFrom{Transactional: true}
	if p.cfg.CheckpointEvery > 0 {
		st, at, ok, err := p.loadCheckpoint(ctx, kc)
		if err == nil && ok {
			err = p.load(st)
		}
		switch {
		case err != nil:
			p.log.Warn("planner: checkpoint not used; replaying every transition", "err", err)
			p.reset()
		case ok:
			for _, o := range st.Open {
				pr := &progress{job: o.Job, position: uint32(o.Position), queuedAt: o.QueuedAtMs}
				for _, h := range o.Holders {
					if pr.holders == nil {
						pr.holders = map[uint32]holding{}
					}
					pr.holders[h.UnitId] = holding{executor: h.Executor, seq: h.DispatchSeq}
				}
				jobs[o.Job.GetJobId()] = pr
			}
			from.Next = st.TransitionsNext
			if from.Next == nil {
				from.Next = map[int32]int64{}
			}
			stats.FromCheckpoint, stats.CheckpointAge = true, now.Sub(at)
			p.ckpt.last = at
		}
	}
	// The transitions are read partition by partition, then applied in the
	// order the planner wrote them (JobTransition.seq): one job's come in
	// order either way, but a job that took back a CRC mark and another
	// that then sent the same content to those users must be applied in
	// that order too. Records without a seq (earlier builds) come first.
	replay := func(from streams.ReplayFrom) (map[int32]int64, error) {
		var ts []*pb.JobTransition
		next, err := streams.ReplayTo(ctx, kc, p.cfg.Topic(schemas.TopicJobTransitions), from, func(r *kgo.Record) error {
			stats.Transitions++
			t := new(pb.JobTransition)
			if streams.Decode(r, t) == nil {
				ts = append(ts, t)
			}
			return nil
		})
		if err != nil {
			return next, err
		}
		sort.SliceStable(ts, func(a, b int) bool { return ts[a].Seq < ts[b].Seq })
		for _, t := range ts {
			p.seq = max(p.seq, t.Seq)
			if err := p.observe(ctx, t, jobs, now); err != nil {
				return next, err
			}
		}
		return next, nil
	}
	next, err := replay(from)
	if errors.Is(err, streams.ErrOutOfRetention) && stats.FromCheckpoint {
		p.log.Warn("planner: transitions after the checkpoint are gone; replaying every transition", "err", err)
		p.reset()
		clear(jobs)
		stats = RestoreStats{}
		next, err = replay(streams.ReplayFrom{Transactional: true})
	}
	if err != nil {
		return err
	}
	if p.illegal > 0 {
		p.log.Warn("planner: restore skipped transitions that do not fit the machine", "count", p.illegal)
	}
	oldest := int64(math.MaxInt64) // when the oldest job still queued was queued
	for id, pr := range jobs {
		st := p.machine.State(id)
		switch st {
		case pb.JobState_QUEUED, pb.JobState_DISPATCHING, pb.JobState_SENDING, pb.JobState_PREEMPTED,
			pb.JobState_RESUMING, pb.JobState_PAUSED, pb.JobState_DRAINING:
		default:
			continue // before filtering: its timer or its next input moves it on
		}
		kept, err := p.cfg.Packages.Get(ctx, pr.job.PackageUri)
		if err != nil {
			return fmt.Errorf("planner: restore %s: %w", id, err)
		}
		q := p.enqueue(pr.job, kept, st, pr.queuedAt)
		q.next = pr.position
		if pr.holders != nil {
			q.holder = pr.holders
		}
		oldest = min(oldest, pr.queuedAt)
	}
	if len(p.queue) > 0 {
		if err := p.restoreDone(ctx, kc, oldest); err != nil {
			return err
		}
	}
	p.rebuildInflight()
	p.activeSince = now
	p.ckpt.next = next
	stats.Took = time.Since(began)
	p.restoreStats = stats
	return nil
}

// observe applies one transition read back from the topic.
func (p *Planner) observe(ctx context.Context, t *pb.JobTransition, jobs map[string]*progress, now time.Time) error {
	if err := p.machine.Observe(t); err != nil {
		p.illegal++
		return nil
	}
	pr := jobs[t.JobId]
	if pr == nil {
		pr = &progress{}
		jobs[t.JobId] = pr
	}
	if t.Job != nil {
		pr.job = t.Job
	}
	switch t.To {
	case pb.JobState_PACKAGE_READY:
		if sameDay(t.AtMs, now) && t.Job != nil {
			p.countJob(t.Job.AccountId, time.UnixMilli(t.AtMs).In(now.Location()))
		}
	case pb.JobState_QUEUED:
		kept, err := p.cfg.Packages.Get(ctx, t.Job.PackageUri)
		if err != nil {
			return fmt.Errorf("planner: restore %s: filtered package: %w", t.JobId, err)
		}
		pr.queuedAt = t.AtMs
		p.sent.Record(t.Job.ContentCrc, kept)
		if sameDay(t.AtMs, now) && !t.Job.Realtime {
			p.ledger.Charge(now, kept)
		}
	case pb.JobState_SENDING, pb.JobState_DRAINING:
		pr.position = uint32(t.Position)
		pr.dispatched(t)
	case pb.JobState_CANCELLED, pb.JobState_EXPIRED, pb.JobState_PARTIALLY_COMPLETED:
		if pr.job != nil && pr.queuedAt != 0 { // it was filtered and charged
			kept, err := p.cfg.Packages.Get(ctx, pr.job.PackageUri)
			if err != nil {
				return fmt.Errorf("planner: restore %s: filtered package: %w", t.JobId, err)
			}
			p.giveBack(pr.job, kept, uint32(t.Position), pr.queuedAt, now)
			p.giveBackUnits(pr.job, kept, t.RefusedUnits, pr.queuedAt, now)
		}
	}
	if job.Terminal(t.To) {
		delete(jobs, t.JobId)
	}
	return nil
}

// sameDay reports whether ms falls on now's day, in now's location: the
// quota and the jobs per account count per day.
func sameDay(ms int64, now time.Time) bool {
	y, m, d := time.UnixMilli(ms).In(now.Location()).Date()
	ny, nm, nd := now.Date()
	return y == ny && m == nm && d == nd
}

// restoreDone marks the queued jobs' units done from push.executors: the
// completions after the oldest was queued; the heartbeats before (a day
// of them, several a second per executor) are not read again. The
// revocations there put units back to be sent again (takeBack).
func (p *Planner) restoreDone(ctx context.Context, kc streams.Cluster, oldest int64) error {
	from := streams.ReplayFrom{Time: time.UnixMilli(oldest).Add(-executorClockSkew)}
	return streams.Replay(ctx, kc, p.cfg.Topic(schemas.TopicExecutors), from, func(r *kgo.Record) error {
		var l pb.ExecutorLoad
		switch {
		case streams.Decode(r, &l) != nil:
		case len(l.Revoked) > 0:
			for _, u := range l.Revoked {
				if q := p.queue[u.JobId]; q != nil {
					q.revoke(l.Executor, u)
				}
			}
		case l.DoneJobId != "":
			if q := p.queue[l.DoneJobId]; q != nil {
				q.markDone(&l)
			}
		}
		return nil
	})
}

// executorClockSkew is how far an executor's clock (its records'
// timestamps) may run behind the planner's (the transitions' times).
const executorClockSkew = 10 * time.Minute

// Run plans until ctx ends. Any number of planners may run in one group:
// one is active and holds every input partition (streams.SingleActive),
// the others stand by. The planner that is handed the partitions rebuilds
// its directory and its memory from the topics before its first record,
// and so does one whose batch was aborted.
//
// Why not share jobs by partition: dispatch is one decision over every
// queued job's score and every executor's room, so split planners would
// over-book executors and pre-empt blindly. Planning is light (hundreds of
// thousands of jobs a day), so one active planner is enough; what matters
// is that a standby takes over within seconds (SessionTimeout).
func (p *Planner) Run(ctx context.Context, opts ...streams.Option) error {
	p.mu.Lock()
	p.runCtx = ctx // revocations run on it (reassign.go)
	p.mu.Unlock()
	inputs := append([]string{p.cfg.Topic(schemas.TopicJobs), p.cfg.Topic(schemas.TopicJobCommands), p.cfg.Topic(schemas.TopicExecutors)}, p.cfg.Directory.Topics()...)
	opts = append([]streams.Option{
		streams.Kafka(p.cfg.Kafka),
		streams.Declare(Spec, p.cfg.Namespace), // group: pipeline.PlannerGroup
		streams.Inputs(inputs...),
		streams.DeadLetterTopic(p.cfg.Topic(schemas.TopicDeadLetter)),
		streams.SingleActive(),
		streams.ClientOpts(
			kgo.SessionTimeout(SessionTimeout), kgo.HeartbeatInterval(SessionTimeout/6),
			kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
				p.mu.Lock()
				p.stale = true
				p.mu.Unlock()
			})),
		// A batch retried after a transient error (a package not on its
		// topic yet) starts from the committed state, not from what its
		// failed attempt moved in memory.
		streams.OnRetry(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.restoreErr = errRestorePending
		}),
		streams.BeforeBatch(func(context.Context, []*kgo.Record) { p.captureCheckpoint() }),
		streams.AfterBatch(func(_ context.Context, out *streams.Output) error { return p.emitCheckpoint(out) }),
		streams.OnBatchEnd(func(committed bool) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.checkpointBatchEnd(committed)
			if !committed {
				p.restoreErr = errRestorePending // rebuilt before the batch is retried
			}
		}),
	}, opts...)
	route, err := streams.Route(Spec, p.cfg.Namespace, p.inputs()...)
	if err != nil {
		return err
	}
	r, err := streams.New("push-planner", p.guarded(route), opts...)
	if err != nil {
		return err
	}
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.lister != nil {
			p.lister.Close()
			p.lister = nil
		}
	}()
	return r.Run(ctx)
}

// SessionTimeout is how long the group waits for a planner that stopped
// heartbeating (a crash, kill -9) before a standby takes over.
const SessionTimeout = 6 * time.Second
