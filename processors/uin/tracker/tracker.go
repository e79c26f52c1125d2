// Package tracker is the registration tracking of seed 003: every
// allocation enters the check queue, and timers at a few checkpoints after
// it (default 1 h, 1 day, 7 days, 30 days; configurable and extendable)
// judge from the uin's usage whether the registration was abandoned or is
// spam. A recyclable uin gets a ticket request on uin.recycle-requests;
// one still alive at the last checkpoint is handed over to the stock
// classification, which judges accounts older than 90 days.
//
// The rules (Rules, applied at each checkpoint in this order):
//  1. abandoned: the registration never completed;
//  2. spam: at least SpamReports spam reports from other users;
//  3. spam: a burst sender: at least BurstMessages messages and at most
//     one login, judged from the second checkpoint on;
//  4. spam: at the last checkpoint, no usage at all after the first day
//     (spam registrations go quiet within days; real users come back).
//
// State is one Tracking record per uin in Pebble, whose changelog is the
// compacted uin.tracking; inputs are co-partitioned by uin, so the store is
// rebuilt per partition on assignment (streams.Restorer).
package tracker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/timer"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
	"surge/streams/metrics"
)

// Verdicts.
const (
	Live       = "live"        // stopped recycling: a user came back
	HandedOver = "handed_over" // alive at the last checkpoint: stock classification's now
)

// Usage kinds the rules read (besides recycling.KindLogin).
const (
	KindMessage    = "message"
	KindSpamReport = "spam_report"
)

// ChannelRestore marks a registration made by the restore tool: not new,
// so not tracked.
const ChannelRestore = "restore"

// Rules are the thresholds of the checks.
type Rules struct {
	SpamReports   int64
	BurstMessages int64
}

// Config configures the tracker.
type Config struct {
	streams.Env
	Dir         string
	Checkpoints []time.Duration // after allocation
	Rules       Rules
	Partitions  int
}

// DefaultCheckpoints are the 4 checkpoints; later ones are the stock
// classification's (seed: past 90 days).
var DefaultCheckpoints = []time.Duration{time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour}

// Tracker is the registration tracking processor.
type Tracker struct {
	cfg     Config
	db      *pebble.DB
	restore *streams.Restorer

	mu      sync.Mutex
	staged  *pebble.Batch
	catchUp catchUp // how far each input partition was read (catchup.go)
	// noReadAhead turns the read-ahead off, for BenchmarkReadAhead's
	// baseline only: without it the races catchup.go describes are open.
	noReadAhead bool

	mVerdicts, mCatchUps, mReadAhead metrics.CounterVec
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if len(c.Checkpoints) == 0 {
		c.Checkpoints = DefaultCheckpoints
	}
	if c.Rules == (Rules{}) {
		c.Rules = Rules{SpamReports: 3, BurstMessages: 50}
	}
	if c.Partitions == 0 {
		t, _ := schemas.TopicByName(schemas.TopicRegistrations)
		c.Partitions = int(t.Partitions)
	}
}

// New returns a tracker; Run starts it.
func New(cfg Config) *Tracker {
	cfg.EnsureDefaults()
	t := &Tracker{cfg: cfg,
		mVerdicts:  cfg.Metrics.NewCounterVec("surge_uin_tracking_verdicts_total", "registration check verdicts", "verdict"),
		mCatchUps:  cfg.Metrics.NewCounterVec("surge_uin_tracking_catchups_total", "input partitions read ahead of the consumer before usage was dropped or a checkpoint judged", "topic"),
		mReadAhead: cfg.Metrics.NewCounterVec("surge_uin_tracking_read_ahead_total", "records read ahead of the consumer by catch-ups", "topic")}
	t.restore = streams.NewRestorer(cfg.Kafka, t.clearPartitions, t.applyChangelog, t.cfg.Topic(schemas.TopicTracking))
	return t
}

func stateKey(uin uint32) []byte { return binary.BigEndian.AppendUint32([]byte{'t'}, uin) }

// Run serves until ctx ends.
func (t *Tracker) Run(ctx context.Context, opts ...streams.Option) error {
	db, err := localstore.Open(t.cfg.Dir, true, t.cfg.Log)
	if err != nil {
		return err
	}
	defer db.Close()
	defer t.catchUp.close()
	t.mu.Lock()
	t.db, t.staged = db, db.NewIndexedBatch()
	t.mu.Unlock()
	opts = append([]streams.Option{
		streams.Kafka(t.cfg.Kafka),
		streams.Declare(Spec, t.cfg.Namespace),
		streams.DeadLetterTopic(t.cfg.Topic(schemas.TopicDeadLetter)),
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer())),
		streams.OnBatchEnd(t.batchEnd),
		streams.OnRetry(func() { t.batchEnd(false) }),
		t.restore.Option(),
	}, opts...)
	route, err := streams.Route(Spec, t.cfg.Namespace, t.inputs()...)
	if err != nil {
		return err
	}
	r, err := streams.New("uin-tracker", t.restore.Guard(&t.mu, route), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func (t *Tracker) batchEnd(committed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if committed {
		if err := t.staged.Commit(pebble.NoSync); err != nil {
			panic(fmt.Errorf("tracker: pebble commit: %w", err))
		}
	} else {
		_ = t.staged.Close()
		t.catchUp.forget(nil) // what was read in the batch is not in the state
	}
	t.staged = t.db.NewIndexedBatch()
}

func (t *Tracker) clearPartitions(ps map[int32]bool) error {
	t.catchUp.forget(ps)
	// Keys are a one-byte kind and a 4-byte uin, partitioned like the records.
	return localstore.DeleteWhere(t.db, func(k []byte) bool {
		return len(k) == 5 && ps[int32(streams.PartitionFor(k[1:], t.cfg.Partitions))]
	})
}

func (t *Tracker) applyChangelog(r *kgo.Record) error {
	if len(r.Key) != 4 {
		return nil
	}
	k := append([]byte{'t'}, r.Key...)
	if r.Value == nil {
		return t.db.Delete(k, pebble.NoSync)
	}
	return t.db.Set(k, r.Value, pebble.NoSync)
}

func get(r pebble.Reader, uin uint32) (*pb.Tracking, error) {
	v, cl, err := r.Get(stateKey(uin))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	s := new(pb.Tracking)
	return s, proto.Unmarshal(v, s)
}

// Get returns the tracking state of uin (nil: not tracked).
func (t *Tracker) Get(uin uint32) (*pb.Tracking, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.db == nil {
		return nil, errors.New("tracker: not running")
	}
	return get(t.db, uin)
}

func validUin(u uint64) error {
	if u == 0 || u > math.MaxUint32 {
		return streams.Reject(fmt.Sprintf("uin out of range: %d (uins are 1..%d)", u, uint32(math.MaxUint32)), nil)
	}
	return nil
}

// inputs are the tracker's inputs, each with its handler (Spec.Inputs).
func (t *Tracker) inputs() []streams.Input {
	return []streams.Input{
		streams.On(schemas.TopicRegistrations, t.onRegistration),
		streams.On(schemas.TopicUsage, t.onUsage),
		streams.On(schemas.TopicChecks, t.onCheck),
		streams.OnRecord(schemas.TopicRecycleSteps, t.onRecycleSteps),
	}
}

// onRegistration notes the record's position for the read-ahead (only a
// record that decoded is noted: one that did not is dead-lettered, and a
// catch-up that reads it again skips it), then tracks the uin.
func (t *Tracker) onRegistration(_ context.Context, in *kgo.Record, r *pb.UinRegistration, out *streams.Output) error {
	t.catchUp.delivered(in)
	return t.register(r, in.Offset, out)
}

func (t *Tracker) onUsage(ctx context.Context, in *kgo.Record, u *pb.UsageEvent, out *streams.Output) error {
	t.catchUp.delivered(in)
	tracked, err := t.usage(u, in.Offset, out)
	if err != nil || tracked {
		return err
	}
	// Usage of an untracked uin is dropped (a stock account's), unless
	// its registration was published with it, unread.
	read, err := t.catchUpBefore(ctx, t.cfg.Topic(schemas.TopicRegistrations), in.Partition, in.Timestamp.UnixMilli(), out)
	if err != nil || !read {
		return err
	}
	_, err = t.usage(u, in.Offset, out)
	return err
}

func (t *Tracker) onCheck(ctx context.Context, in *kgo.Record, c *pb.RegistrationCheck, out *streams.Output) error {
	// Judge with every registration and use published before the
	// checkpoint's timer fired (a backfilled registration's fire at once).
	for _, topic := range []string{schemas.TopicRegistrations, schemas.TopicUsage} {
		if _, err := t.catchUpBefore(ctx, t.cfg.Topic(topic), in.Partition, in.Timestamp.UnixMilli(), out); err != nil {
			return err
		}
	}
	return t.check(c, out)
}

// onRecycleSteps takes a step or a batch of them (recycling.Decode).
func (t *Tracker) onRecycleSteps(_ context.Context, in *kgo.Record, out *streams.Output) error {
	steps, err := recycling.Decode(in)
	if err != nil {
		return err
	}
	return t.recycledSteps(steps, out)
}

// put stages a state and emits its changelog record.
func (t *Tracker) put(s *pb.Tracking, out *streams.Output) error {
	v, _ := proto.Marshal(s)
	_ = t.staged.Set(stateKey(uint32(s.Uin)), v, nil)
	return out.EmitMsg(t.cfg.Topic(schemas.TopicTracking), schemas.UinKey(uint32(s.Uin)), s)
}

// register applies a registration record at offset of uin.registrations
// (-1: no offset, nothing to make idempotent).
func (t *Tracker) register(r *pb.UinRegistration, offset int64, out *streams.Output) error {
	if err := validUin(r.Uin); err != nil {
		return err
	}
	uin := uint32(r.Uin)
	cur, err := get(t.staged, uin)
	if err != nil {
		return err
	}
	if cur != nil && offset >= 0 && offset < cur.RegistrationsNext {
		return nil // applied already: read ahead by a catch-up
	}
	// A uin judged recyclable reaches a new registration only through the
	// pool, after its release; the release may still be on its way here.
	recycled := cur != nil && (cur.Verdict == recycling.Abandoned || cur.Verdict == recycling.Spam) && r.AtMs > cur.RegisteredAtMs
	if cur != nil && !recycled {
		switch {
		case !r.Completed:
			return streams.Reject(fmt.Sprintf("duplicate registration: uin %d already registered at %d (username %q)", uin, cur.RegisteredAtMs, cur.Username), nil)
		case cur.Completed && cur.Username != r.Username:
			return streams.Reject(fmt.Sprintf("duplicate registration: uin %d already completed as %q, not %q", uin, cur.Username, r.Username), nil)
		case cur.Completed:
			return nil // the completion again
		}
		cur.Completed = true
		if r.Username != "" {
			cur.Username = r.Username
		}
		cur.RegistrationsNext = max(cur.RegistrationsNext, offset+1)
		return t.put(cur, out)
	}
	// A new allocation, or a completion that overtook its allocation. The
	// offsets carry over a recycled uin's: its earlier records are applied.
	s := &pb.Tracking{Uin: r.Uin, Username: r.Username, RegisteredAtMs: r.AtMs, Completed: r.Completed, Channel: r.Channel,
		RegistrationsNext: offset + 1}
	if cur != nil {
		s.RegistrationsNext = max(s.RegistrationsNext, cur.RegistrationsNext)
		s.UsageNext = cur.UsageNext
	}
	if r.Channel == ChannelRestore {
		s.Verdict = HandedOver
		return t.put(s, out)
	}
	if err := t.scheduleCheck(s, 0, out); err != nil {
		return err
	}
	return t.put(s, out)
}

func (t *Tracker) scheduleCheck(s *pb.Tracking, idx int32, out *streams.Output) error {
	due := time.UnixMilli(s.RegisteredAtMs).Add(t.cfg.Checkpoints[idx])
	s.NextCheckpoint = idx
	rec, err := timer.Schedule(fmt.Sprintf("uin-check/%d/%d/%d", s.Uin, s.RegisteredAtMs, idx), due,
		t.cfg.Topic(schemas.TopicChecks), schemas.UinKey(uint32(s.Uin)),
		&pb.RegistrationCheck{Uin: s.Uin, Checkpoint: idx, RegisteredAtMs: s.RegisteredAtMs, DueAtMs: due.UnixMilli()})
	if err != nil {
		return err
	}
	rec.Topic = t.cfg.Topic(schemas.TopicTimers)
	out.Emit(rec)
	return nil
}

// usage applies a usage record at offset of uin.usage (-1: no offset).
// tracked is false when the uin has no tracking state at all: a stock
// account's, or one whose registration is not read yet.
func (t *Tracker) usage(u *pb.UsageEvent, offset int64, out *streams.Output) (tracked bool, err error) {
	if err := validUin(u.Uin); err != nil {
		return false, err
	}
	cur, err := get(t.staged, uint32(u.Uin))
	if err != nil || cur == nil || cur.Verdict != "" {
		return cur != nil, err // not a registration tracked now (stock accounts are classified elsewhere)
	}
	if offset >= 0 && offset < cur.UsageNext {
		return true, nil // applied already: read ahead by a catch-up
	}
	if u.AtMs < cur.RegisteredAtMs {
		return true, streams.Reject(fmt.Sprintf("usage %q of uin %d at %d precedes its registration at %d", u.Kind, u.Uin, u.AtMs, cur.RegisteredAtMs), nil)
	}
	switch u.Kind {
	case recycling.KindLogin:
		cur.Logins++
		cur.LastLoginMs = max(cur.LastLoginMs, u.AtMs)
	case KindMessage:
		cur.Messages++
	case KindSpamReport:
		cur.SpamReports++
	}
	cur.LastUsageMs = max(cur.LastUsageMs, u.AtMs)
	cur.UsageNext = max(cur.UsageNext, offset+1)
	return true, t.put(cur, out)
}

// Judge applies the rules at checkpoint idx: the category to recycle as
// and why, or "" for a live registration.
func (t *Tracker) Judge(s *pb.Tracking, idx int) (category, reason string) {
	r := t.cfg.Rules
	last := idx == len(t.cfg.Checkpoints)-1
	switch {
	case !s.Completed:
		return recycling.Abandoned, fmt.Sprintf("registration not completed at checkpoint %d", idx)
	case s.SpamReports >= r.SpamReports:
		return recycling.Spam, fmt.Sprintf("%d spam reports", s.SpamReports)
	case idx >= 1 && s.Messages >= r.BurstMessages && s.Logins <= 1:
		return recycling.Spam, fmt.Sprintf("burst sender: %d messages, %d logins", s.Messages, s.Logins)
	case last && s.LastUsageMs < s.RegisteredAtMs+24*time.Hour.Milliseconds():
		return recycling.Spam, "no usage after the first day"
	}
	return "", ""
}

func (t *Tracker) check(c *pb.RegistrationCheck, out *streams.Output) error {
	if err := validUin(c.Uin); err != nil {
		return err
	}
	cur, err := get(t.staged, uint32(c.Uin))
	if err != nil {
		return err
	}
	if cur == nil {
		return streams.Reject(fmt.Sprintf("checkpoint %d for untracked uin %d", c.Checkpoint, c.Uin), nil)
	}
	if cur.Verdict != "" || cur.NextCheckpoint != c.Checkpoint || cur.RegisteredAtMs != c.RegisteredAtMs {
		return nil // a stale or repeated checkpoint
	}
	idx := int(c.Checkpoint)
	if idx >= len(t.cfg.Checkpoints) {
		return streams.Reject(fmt.Sprintf("checkpoint %d of uin %d is beyond the %d configured", idx, c.Uin, len(t.cfg.Checkpoints)), nil)
	}
	category, reason := t.Judge(cur, idx)
	switch {
	case category != "":
		cur.Verdict = category
		g := recycling.Grant(recycling.Finding{Uin: uint32(c.Uin), Category: category, Username: cur.Username, Reason: reason,
			LastLoginMs: cur.LastLoginMs, RegisteredAtMs: cur.RegisteredAtMs}, t.cfg.Now())
		if err := out.EmitMsg(t.cfg.Topic(schemas.TopicRecycleReqs), schemas.UinKey(uint32(c.Uin)), g); err != nil {
			return err
		}
	case idx+1 < len(t.cfg.Checkpoints):
		if err := t.scheduleCheck(cur, int32(idx+1), out); err != nil {
			return err
		}
	default:
		cur.Verdict = HandedOver
	}
	if cur.Verdict != "" {
		t.mVerdicts.With(cur.Verdict).Inc()
	}
	return t.put(cur, out)
}

// recycledSteps follows the steps a record of uin.recycle-steps carries:
// one ticket's, or a batch's.
func (t *Tracker) recycledSteps(steps []*pb.RecycleStep, out *streams.Output) error {
	for _, e := range steps {
		if err := t.recycled(e, out); err != nil {
			return err
		}
	}
	return nil
}

// recycled follows the recycle queue: a released uin is free for a new
// registration; a stopped ticket means the user is alive.
func (t *Tracker) recycled(s *pb.RecycleStep, out *streams.Output) error {
	if s.Uin == 0 || s.Uin > math.MaxUint32 {
		return nil
	}
	cur, err := get(t.staged, uint32(s.Uin))
	if err != nil || cur == nil {
		return err
	}
	switch s.Step {
	case pb.RecycleStepKind_RELEASE:
		if cur.RegisteredAtMs > s.AtMs {
			return nil // already a new registration on the released uin
		}
		_ = t.staged.Delete(stateKey(uint32(s.Uin)), nil)
		out.Emit(&kgo.Record{Topic: t.cfg.Topic(schemas.TopicTracking), Key: schemas.UinKey(uint32(s.Uin))}) // tombstone
	case pb.RecycleStepKind_STOPPED:
		if cur.Verdict == recycling.Abandoned || cur.Verdict == recycling.Spam {
			cur.Verdict = Live
			return t.put(cur, out)
		}
	}
	return nil
}
