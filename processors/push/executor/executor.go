// Package executor sends the units the planner dispatches. Each executor
// owns one single-partition queue, push.units.<name>, so its units run in
// dispatch order (the planner's priority order). For each unit it splits
// the targets into online and offline with the online bitmap (a global copy
// of push.presence, the whole 32-bit uin space), reports the online part as
// delivered, and hands the offline part to the offline queues on
// push.offline, grouped so each batch lands on its uins' login partition.
//
// Everything a unit produces, including the completion the planner counts,
// is one Kafka transaction with the unit's offset: a crashed executor
// resumes at the first unit it had not committed and sends nothing twice.
package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"surge/schemas/uinset"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// Config configures an executor.
type Config struct {
	streams.Env
	Name      string
	Capacity  uint64        // uins it takes at once (reported; the planner gives it at most that many in flight); 0: no limit of its own
	Heartbeat time.Duration // load report period
	// Dir holds the online bitmap's checkpoint (empty: none; a restart
	// then reads push.presence from the start).
	Dir string
	// CheckpointEvery is the checkpoint period (default 10 s).
	CheckpointEvery time.Duration
}

// Executor is one sender.
type Executor struct {
	cfg Config

	mu     sync.RWMutex
	online *roaring.Bitmap

	loginParts int
	// revocations: the dispatches the planner took back, read from the
	// queue at each session's start (readRevocations).
	revMu       sync.Mutex
	revocations map[revocation]bool

	draining  atomic.Bool
	drainDone atomic.Bool
	drainedAt atomic.Int64
	lastUnit  atomic.Int64
	units     atomic.Int64
	reached   atomic.Int64
	offline   atomic.Int64

	mUnits, mUins metrics.CounterVec
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Heartbeat == 0 {
		c.Heartbeat = 200 * time.Millisecond
	}
}

// New returns an executor.
func New(cfg Config) *Executor {
	cfg.EnsureDefaults()
	x := &Executor{cfg: cfg, online: roaring.New()}
	x.mUnits = cfg.Metrics.NewCounterVec("surge_push_units_sent_total", "units sent", "executor")
	x.mUins = cfg.Metrics.NewCounterVec("surge_push_uins_total", "targets handled", "executor", "outcome")
	return x
}

// UnitsTopic is the executor's own queue.
func (x *Executor) UnitsTopic() string { return UnitsTopic(x.cfg.Namespace, x.cfg.Name) }

// UnitsTopic is the queue of executor name in namespace ns.
func UnitsTopic(ns, name string) string { return ns + schemas.TopicUnits + "." + name }

// group is executor name's consumer group (and static instance id): one
// member, the executor.
func group(ns, name string) string { return ns + "push-executor-" + name }

// TransactionalID is the transactional id executor name commits under.
// The planner writes its revocations under it, which fences the executor
// (see Revocations).
func TransactionalID(ns, name string) string {
	return streams.TransactionalID(group(ns, name), group(ns, name))
}

// Stats are this process's counts: units, delivered and offline uins.
func (x *Executor) Stats() (units, delivered, offline int64) {
	return x.units.Load(), x.reached.Load(), x.offline.Load()
}

// OnlineBytes is the in-memory size of the online bitmap.
func (x *Executor) OnlineBytes() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.online.GetSizeInBytes()
}

// Drain asks the executor to finish in-flight work and stop: it tells the
// planner it takes nothing new, finishes what is queued, and Run returns.
func (x *Executor) Drain() {
	if !x.draining.Swap(true) {
		x.drainedAt.Store(time.Now().UnixMilli())
	}
}

// ErrDrained is returned by Run after a drain finished.
var ErrDrained = errors.New("executor drained")

// Run sends until ctx ends or a drain completes.
func (x *Executor) Run(ctx context.Context, opts ...streams.Option) error {
	admin, err := x.cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := streams.EnsureTopics(ctx, admin, x.cfg.Replication, schemas.Topic{Name: x.UnitsTopic(), Partitions: 1, Retention: 7 * 24 * time.Hour}); err != nil {
		return fmt.Errorf("executor: create %s: %w", x.UnitsTopic(), err)
	}
	if x.loginParts, err = streams.CoPartitioned(ctx, x.cfg.Kafka, x.cfg.Topic(schemas.TopicLogin), x.cfg.Topic(schemas.TopicOffline)); err != nil {
		return err
	}
	tctx, stopTable := context.WithCancel(ctx)
	defer stopTable()
	presenceTopic := x.cfg.Topic(schemas.TopicPresence)
	var topts []streams.TableOption
	if x.cfg.Dir != "" {
		if bm, next, err := x.loadCheckpoint(presenceTopic); err == nil && x.checkpointCurrent(ctx, admin, presenceTopic, next) {
			x.mu.Lock()
			x.online = bm
			x.mu.Unlock()
			topts = append(topts, streams.TableFrom(next))
			x.cfg.Log.Info("executor: online bitmap from checkpoint", "executor", x.cfg.Name, "online", bm.GetCardinality())
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			x.cfg.Log.Warn("executor: online checkpoint not used; reading push.presence from the start", "err", err)
		}
		every := x.cfg.CheckpointEvery
		if every <= 0 {
			every = 10 * time.Second
		}
		topts = append(topts, streams.TableCheckpoint(every, func(next map[int32]int64) {
			if err := x.saveCheckpoint(presenceTopic, next); err != nil {
				x.cfg.Log.Warn("executor: online checkpoint not saved", "err", err)
			}
		}))
	}
	table, err := streams.FollowTable(tctx, x.cfg.Kafka, presenceTopic, x.applyPresence, topts...)
	if err != nil {
		return fmt.Errorf("executor: follow presence: %w", err)
	}
	select {
	case <-table.Ready():
	case <-ctx.Done():
		return nil
	}
	x.cfg.Log.Info("executor: online bitmap loaded", "executor", x.cfg.Name, "online", x.onlineCount())

	rctx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	go x.followCommands(rctx, time.Now())
	hbDone := make(chan struct{})
	drained := make(chan struct{})
	go func() { defer close(hbDone); x.heartbeat(rctx, admin, stopRunner, drained) }()

	opts = append([]streams.Option{
		streams.Kafka(x.cfg.Kafka),
		streams.Declare(Spec, x.cfg.Namespace),
		streams.Inputs(x.UnitsTopic()),
		streams.DeadLetterTopic(x.cfg.Topic(schemas.TopicDeadLetter)),
	}, opts...)
	// The executor's identity comes last, over any instance id the caller
	// gave: its group has one member, this executor, whose transactional
	// id the planner must know to take units back (TransactionalID). As a
	// static member, a restarted executor takes its queue back at once
	// instead of waiting out the killed one's session.
	opts = append(opts,
		streams.Group(group(x.cfg.Namespace, x.cfg.Name)),
		streams.InstanceID(group(x.cfg.Namespace, x.cfg.Name)),
		streams.StaticMembership(),
		streams.OnSessionStart(x.readRevocations),
	)
	r, err := streams.New("push-executor", x.Handle(), opts...)
	if err != nil {
		return err
	}
	err = r.Run(rctx)
	stopRunner()
	<-hbDone
	select {
	case <-drained:
		x.drainDone.Store(true)
		return ErrDrained
	default:
	}
	return err
}

// followCommands drains the executor when push.executor-commands asks it
// to. It reads the commands published since the executor started (by
// timestamp), so a drain asked before a restart does not drain the
// executor that came back.
func (x *Executor) followCommands(ctx context.Context, since time.Time) {
	topic := x.cfg.Topic(schemas.TopicExecCommands)
	cl, err := x.cfg.Kafka.NewClient(kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AfterMilli(since.UnixMilli())))
	if err != nil {
		x.cfg.Log.Warn("executor: commands not followed", "err", err)
		return
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) {
			var c pb.ExecutorCommand
			if streams.Decode(r, &c) != nil || c.Executor != x.cfg.Name {
				return
			}
			if c.Op == pb.ExecutorCommand_DRAIN {
				x.cfg.Log.Info("executor: drain asked", "executor", x.cfg.Name, "by", c.RequestedBy, "reason", c.Reason)
				x.Drain()
			}
		})
	}
}

// Drained reports whether a drain finished and Run returned.
func (x *Executor) Drained() bool { return x.drainDone.Load() }

// checkpointCurrent reports whether a checkpoint's offsets can still be
// read on (streams.OffsetsReadable).
func (x *Executor) checkpointCurrent(ctx context.Context, cl *kgo.Client, topic string, next map[int32]int64) bool {
	if err := streams.OffsetsReadable(ctx, cl, topic, next); err != nil {
		x.cfg.Log.Warn("executor: online checkpoint is stale", "err", err)
		return false
	}
	return true
}

func (x *Executor) applyPresence(r *kgo.Record) {
	var ev pb.LoginEvent
	if streams.Decode(r, &ev) != nil || ev.Uin > schemas.MaxUin {
		return
	}
	x.mu.Lock()
	if ev.Online {
		x.online.Add(uint32(ev.Uin))
	} else {
		x.online.Remove(uint32(ev.Uin))
	}
	x.mu.Unlock()
}

func (x *Executor) onlineCount() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.online.GetCardinality()
}

// heartbeat reports load until ctx ends; when a drain has been announced
// long enough for the planner to see it and no unit arrived for a second,
// it stops the runner (which commits and leaves) and closes drained.
func (x *Executor) heartbeat(ctx context.Context, cl *kgo.Client, stop func(), drained chan struct{}) {
	t := time.NewTicker(x.cfg.Heartbeat)
	defer t.Stop()
	for {
		rec, _ := streams.NewRecord(x.cfg.Topic(schemas.TopicExecutors), []byte(x.cfg.Name), &pb.ExecutorLoad{
			Executor: x.cfg.Name, UnitsTopic: x.UnitsTopic(), CapacityUins: x.cfg.Capacity,
			Draining: x.draining.Load(), AtMs: time.Now().UnixMilli()})
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil && ctx.Err() == nil {
				x.cfg.Log.Warn("executor: heartbeat failed", "err", err)
			}
		})
		if x.draining.Load() {
			now := time.Now().UnixMilli()
			announced := now-x.drainedAt.Load() > 3*x.cfg.Heartbeat.Milliseconds()+1000
			if announced && now-x.lastUnit.Load() > 1000 {
				x.cfg.Log.Info("executor: drained", "executor", x.cfg.Name)
				close(drained)
				stop()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Handle is the handler over the executor's units.
func (x *Executor) Handle() streams.Handler {
	return streams.Typed(func(_ context.Context, in *kgo.Record, u *pb.SendTaskUnit, out *streams.Output) error {
		if u.Revoked {
			return nil // read at the session's start (readRevocations)
		}
		if x.revoked(u) {
			x.cfg.Log.Info("executor: unit skipped: the planner took it back while this executor was silent",
				"job", u.JobId, "unit", u.UnitId, "dispatch", u.DispatchSeq)
			x.mUins.With(x.cfg.Name, "revoked").Add(float64(u.Count))
			return nil
		}
		x.lastUnit.Store(time.Now().UnixMilli())
		targets, err := uinset.Decode(u.Targets)
		if err != nil {
			// Refused, not sent: the planner is told (its targets get their
			// quota back and the job ends PARTIALLY_COMPLETED) rather than
			// left waiting for a unit that will never be done.
			x.cfg.Log.Warn("executor: unit refused: its targets are unreadable", "job", u.JobId, "unit", u.UnitId, "err", err)
			x.mUins.With(x.cfg.Name, "refused").Add(float64(u.Count))
			return out.EmitMsg(x.cfg.Topic(schemas.TopicExecutors), []byte(x.cfg.Name), &pb.ExecutorLoad{
				Executor: x.cfg.Name, UnitsTopic: x.UnitsTopic(), AtMs: time.Now().UnixMilli(),
				DoneJobId: u.JobId, DoneUnitId: u.UnitId, DoneRefused: true})
		}
		x.mu.RLock()
		online := roaring.And(targets, x.online)
		x.mu.RUnlock()
		targets.AndNot(online)
		now := time.Now().UnixMilli()
		if !online.IsEmpty() {
			buf, err := online.ToBytes()
			if err != nil {
				return err
			}
			if err := out.EmitMsg(x.cfg.Topic(schemas.TopicReports), []byte(u.JobId), &pb.DeliveryReport{
				JobId: u.JobId, Status: pb.DeliveryStatus_DELIVERED, AtMs: now, UnitId: u.UnitId, Uins: buf,
				DisplayAtMs: u.DisplayAtMs, Executor: x.cfg.Name, ContentId: u.ContentId}); err != nil {
				return err
			}
		}
		if err := x.queueOffline(u, targets, now, out); err != nil {
			return err
		}
		if err := out.EmitMsg(x.cfg.Topic(schemas.TopicExecutors), []byte(x.cfg.Name), &pb.ExecutorLoad{
			Executor: x.cfg.Name, UnitsTopic: x.UnitsTopic(), AtMs: now,
			DoneJobId: u.JobId, DoneUnitId: u.UnitId, DoneUins: u.Count}); err != nil {
			return err
		}
		x.units.Add(1)
		x.reached.Add(int64(online.GetCardinality()))
		x.offline.Add(int64(targets.GetCardinality()))
		x.mUnits.With(x.cfg.Name).Inc()
		x.mUins.With(x.cfg.Name, "delivered").Add(float64(online.GetCardinality()))
		x.mUins.With(x.cfg.Name, "offline").Add(float64(targets.GetCardinality()))
		return nil
	})
}

// queueOffline writes the offline targets as batches co-partitioned with
// push.login: each batch is keyed by one of its own uins.
func (x *Executor) queueOffline(u *pb.SendTaskUnit, offline *roaring.Bitmap, now int64, out *streams.Output) error {
	if offline.IsEmpty() {
		return nil
	}
	// One report for the unit's offline part, so push.reports alone
	// accounts for every target (reconciliation reads it).
	all, err := offline.ToBytes()
	if err != nil {
		return err
	}
	if err := out.EmitMsg(x.cfg.Topic(schemas.TopicReports), []byte(u.JobId), &pb.DeliveryReport{
		JobId: u.JobId, Status: pb.DeliveryStatus_QUEUED_OFFLINE, AtMs: now, UnitId: u.UnitId, Uins: all,
		DisplayAtMs: u.DisplayAtMs, Executor: x.cfg.Name, ContentId: u.ContentId}); err != nil {
		return err
	}
	parts := make([]*roaring.Bitmap, x.loginParts)
	it := offline.Iterator()
	var key [4]byte
	for it.HasNext() {
		uin := it.Next()
		key = [4]byte{byte(uin >> 24), byte(uin >> 16), byte(uin >> 8), byte(uin)}
		p := streams.PartitionFor(key[:], x.loginParts)
		if parts[p] == nil {
			parts[p] = roaring.New()
		}
		parts[p].Add(uin)
	}
	for _, set := range parts {
		if set == nil {
			continue
		}
		buf, err := set.ToBytes()
		if err != nil {
			return err
		}
		if err := out.EmitMsg(x.cfg.Topic(schemas.TopicOffline), schemas.UinKey(set.Minimum()), &pb.OfflineBatch{
			JobId: u.JobId, UnitId: u.UnitId, ContentId: u.ContentId, DisplayAtMs: u.DisplayAtMs, Uins: buf, AtMs: now}); err != nil {
			return err
		}
	}
	return nil
}

// OnlineCount is the number of users the executor sees online.
func (x *Executor) OnlineCount() uint64 { return x.onlineCount() }
