package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/app"
	"surge/processors/push/filter"
	"surge/processors/push/internal/quota"
	"surge/processors/push/numpkg"
	"surge/processors/push/planner"
	"surge/processors/push/recovery"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"

	"google.golang.org/protobuf/proto"

	"surge/processors/push/directory"
)

func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type env struct {
	t     *testing.T
	ctx   context.Context
	ns    string
	b     streamstest.Backend
	cl    *kgo.Client
	stack *app.Stack
}

// publish produces directory records as a platform would.
func publish(t *testing.T, s *app.Stack, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Publish(ctx, recs...); err != nil {
		t.Fatal(err)
	}
}

func start(t *testing.T, b streamstest.Backend, cfg planner.Config, setup func(*app.Stack)) *env {
	t.Helper()
	ns := streamstest.Unique("t") + "."
	s := app.New(b.Kafka, app.Options{Namespace: ns, Dir: t.TempDir(), Executors: 2, Planner: cfg, Log: quiet()})
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.CreateTopics(ctx, streams.OneCopy); err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(s)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := s.Wait(); err != nil {
			t.Errorf("stack: %v", err)
		}
	})
	rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
	defer rcancel()
	if err := s.WaitReady(rctx, 2); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ctx: ctx, ns: ns, b: b, cl: streamstest.Client(t, b.Kafka), stack: s}
}

func testConfig() planner.Config {
	c := planner.DefaultConfig()
	c.UnitSize, c.MaxBacklog, c.MinLead = 500, 3, 5*time.Second
	return c
}

// logins sets users online (true) or offline and waits until every
// executor sees the resulting online count.
func (e *env) logins(online bool, uins ...uint32) {
	e.t.Helper()
	var recs []*kgo.Record
	for _, u := range uins {
		r, err := streams.NewRecord(e.ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: online, AtMs: time.Now().UnixMilli()})
		if err != nil {
			e.t.Fatal(err)
		}
		recs = append(recs, r)
	}
	streamstest.ProduceSync(e.t, e.cl, recs...)
}

func (e *env) waitOnline(n uint64) {
	e.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok := true
		for _, x := range e.stack.Executors {
			if x.OnlineCount() != n {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("executors do not see %d users online (first sees %d)", n, e.stack.Executors[0].OnlineCount())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) submit(j *pb.SendJob) {
	e.t.Helper()
	r, err := streams.NewRecord(e.ns+schemas.TopicJobs, []byte(j.JobId), j)
	if err != nil {
		e.t.Fatal(err)
	}
	streamstest.ProduceSync(e.t, e.cl, r)
}

func (e *env) waitState(id string, want ...pb.JobState) pb.JobState {
	e.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		st := e.stack.Planner.State(id)
		for _, w := range want {
			if st == w {
				return st
			}
		}
		if err := e.stack.Err(); err != nil {
			e.t.Fatal(err)
		}
		if time.Now().After(deadline) {
			var moves []string
			for _, tr := range e.transitions(id) {
				moves = append(moves, fmt.Sprintf("%s@%d[%s pos %d]", tr.To, tr.AtMs, tr.Executor, tr.Position))
			}
			e.t.Fatalf("job %s is %s, want %v\n%s\ntransitions: %v", id, st, want, e.stack.Planner.Describe(id), moves)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) outcome(id string) *recovery.Outcome {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o, err := recovery.Read(ctx, e.b.Kafka, e.ns, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

func rangeSet(lo, hi uint32) *roaring.Bitmap {
	b := roaring.New()
	b.AddRange(uint64(lo), uint64(hi))
	return b
}

func inline(t *testing.T, b *roaring.Bitmap) []byte {
	data, err := numpkg.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Online targets are delivered at once, offline ones on login, each once;
// the CRC filter stops a resend; bad jobs are refused with a reason.
func TestDeliveryOnlineOfflineAndRefusals(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := start(t, b, testConfig(), func(s *app.Stack) {
			publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.All &^ filter.Quota))}))
			var recs []*kgo.Record
			for u := uint32(1); u <= 5000; u++ {
				recs = append(recs, directory.FollowRecord(s.Opts.Namespace, 1, u, true))
			}
			recs = append(recs, directory.BlacklistRecord(s.Opts.Namespace, 1, 4999, false),
				directory.BlacklistRecord(s.Opts.Namespace, 1, 5000, false))
			publish(t, s, recs...)
		})
		online := rangeSet(1, 3001)
		e.logins(true, online.ToArray()...)
		e.waitOnline(3000)

		display := time.Now().Add(time.Hour).UnixMilli()
		e.submit(&pb.SendJob{JobId: "followers", AccountId: 1, Source: pb.TargetSource_FOLLOWERS, ContentId: "c1", ContentCrc: 1, DisplayAtMs: display})
		e.waitState("followers", pb.JobState_COMPLETED)
		// 3000 delivered now, 1998 queued offline, 2 blacklisted.
		e.logins(true, rangeSet(3001, 4001).ToArray()...)
		deadline := time.Now().Add(60 * time.Second)
		for {
			o := e.outcome("followers")
			if o.Delivered.GetCardinality() >= 4000 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		o := e.outcome("followers")
		if o.Duplicate != 0 {
			t.Fatalf("%d deliveries reported twice", o.Duplicate)
		}
		if !o.Delivered.Equals(rangeSet(1, 4001)) {
			t.Fatalf("delivered %d users, want 1..4000", o.Delivered.GetCardinality())
		}
		if !o.Filtered.Equals(roaring.BitmapOf(4999, 5000)) {
			t.Fatalf("filtered %v", o.Filtered.ToArray())
		}
		// Pre-delivery: every delivery carries the display time.
		shown := 0
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer rcancel()
		if err := streams.ReadToEnd(rctx, b.Kafka, e.ns+schemas.TopicReports, func(r *kgo.Record) error {
			var rep pb.DeliveryReport
			if streams.Decode(r, &rep) == nil && rep.JobId == "followers" && rep.Status != pb.DeliveryStatus_FILTERED {
				if rep.DisplayAtMs != display {
					t.Errorf("delivery shown at %d, want %d", rep.DisplayAtMs, display)
				}
				shown++
			}
			return nil
		}); err != nil || shown == 0 {
			t.Fatalf("read %d deliveries: %v", shown, err)
		}
		// The rest wait in their queues, and go out on login.
		for _, u := range []uint32{4001, 4998} {
			if p, _ := e.stack.Offline.Pending(u); len(p) != 1 || p[0] != "followers" {
				t.Fatalf("uin %d has queue %v", u, p)
			}
		}
		if p, _ := e.stack.Offline.Pending(10); len(p) != 0 {
			t.Fatalf("delivered user still queued: %v", p)
		}

		// The same content again: nobody gets it twice.
		e.submit(&pb.SendJob{JobId: "again", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c1", ContentCrc: 1,
			InlinePackage: inline(t, rangeSet(1, 5001))})
		e.waitState("again", pb.JobState_COMPLETED)
		if o := e.outcome("again"); !o.Delivered.IsEmpty() {
			t.Fatalf("resent content to %d users", o.Delivered.GetCardinality())
		}

		// A scheduled job waits for its timer, then runs. Its time and
		// b3's below leave 4 s between publishing and the planner's read
		// (MinLead 5 s): a loaded machine took more than the 1 s they had.
		e.submit(&pb.SendJob{JobId: "later", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c2", ContentCrc: 2,
			InlinePackage: inline(t, rangeSet(1, 11)), ScheduledAtMs: time.Now().Add(9 * time.Second).UnixMilli()})
		e.waitState("later", pb.JobState_WAITING_SCHEDULE)
		e.waitState("later", pb.JobState_COMPLETED)
		if o := e.outcome("later"); o.Delivered.GetCardinality() != 10 {
			t.Fatalf("scheduled job delivered %d", o.Delivered.GetCardinality())
		}

		// Bad input: each refused with its reason; the pipeline goes on.
		past := time.Now().Add(-time.Hour).UnixMilli()
		bad := map[string]*pb.SendJob{
			"unknown account": {JobId: "b1", AccountId: 99, Source: pb.TargetSource_FOLLOWERS, ContentId: "x"},
			"in the past":     {JobId: "b2", AccountId: 1, Source: pb.TargetSource_FOLLOWERS, ContentId: "x", ScheduledAtMs: past},
			"too soon":        {JobId: "b3", AccountId: 1, Source: pb.TargetSource_FOLLOWERS, ContentId: "x", ScheduledAtMs: time.Now().Add(4500 * time.Millisecond).UnixMilli()},
			"empty package":   {JobId: "b4", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "x", InlinePackage: []byte{}, PackageUri: "file:///nonexistent/empty.snpk"},
			"corrupt package": {JobId: "b5", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "x", InlinePackage: []byte("SNPK garbage")},
			"duplicate job":   {JobId: "followers", AccountId: 1, Source: pb.TargetSource_FOLLOWERS, ContentId: "x"},
		}
		for _, j := range bad {
			e.submit(j)
		}
		streamstest.ProduceSync(t, e.cl, mustRecord(t, e.ns+schemas.TopicLogin, &pb.LoginEvent{Uin: 1 << 33, Online: true}))
		e.waitState("b1", pb.JobState_REJECTED)
		e.waitState("b2", pb.JobState_REJECTED)
		e.waitState("b3", pb.JobState_REJECTED)
		e.waitState("b4", pb.JobState_FAILED)
		e.waitState("b5", pb.JobState_FAILED)
		dlq := streamstest.ReadN(t, b.Kafka, e.ns+schemas.TopicDeadLetter, true, len(bad)+1, 30*time.Second, time.Second)
		var reasons []string
		for _, r := range dlq {
			why, _ := streams.Header(r, "dlq-reason")
			reasons = append(reasons, why)
		}
		all := strings.Join(reasons, "\n")
		for _, want := range []string{"unknown account: 99", "scheduled in the past", "scheduled too soon", "bad package", "duplicate job id \"followers\"", "outside the 32-bit space"} {
			if !strings.Contains(all, want) {
				t.Errorf("no dead letter says %q; got:\n%s", want, all)
			}
		}
		if e.stack.Planner.State("followers") != pb.JobState_COMPLETED {
			t.Fatal("the duplicate changed the original job")
		}
	})
}

func mustRecord(t *testing.T, topic string, m *pb.LoginEvent) *kgo.Record {
	r, err := streams.NewRecord(topic, schemas.UinKey(uint32(m.Uin)), m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Many jobs at once to the same users never exceed the released quota.
func TestQuotaUnderConcurrentJobs(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		cfg := testConfig()
		// Late on a day whose six windows have all released their unit by
		// 23:00, so no job waits for a release still to come.
		now := time.Now()
		late := time.Date(now.Year(), now.Month(), now.Day(), 23, 0, 0, 0, now.Location())
		for quota.Released(late, cfg.QuotaSeed) < quota.PerDay {
			late = late.AddDate(0, 0, -1)
		}
		offset := late.Sub(now)
		cfg.Now = func() time.Time { return time.Now().Add(offset) }
		e := start(t, b, cfg, func(s *app.Stack) {
			publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.All))}))
		})
		users := rangeSet(1, 2001)
		e.logins(true, users.ToArray()...)
		e.waitOnline(2000)
		releasedBefore := quota.Released(cfg.Now(), cfg.QuotaSeed)
		const jobs = 9
		var recs []*kgo.Record
		for i := range jobs {
			j := &pb.SendJob{JobId: fmt.Sprintf("q%d", i), AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c",
				ContentCrc: uint32(100 + i), InlinePackage: inline(t, users), FilterMask: uint32(filter.Quota | filter.CRC)}
			r, _ := streams.NewRecord(e.ns+schemas.TopicJobs, []byte(j.JobId), j)
			recs = append(recs, r)
		}
		streamstest.ProduceSync(t, e.cl, recs...)
		for i := range jobs {
			e.waitState(fmt.Sprintf("q%d", i), pb.JobState_COMPLETED)
		}
		releasedAfter := quota.Released(cfg.Now(), cfg.QuotaSeed)
		per := map[uint32]int{}
		for i := range jobs {
			o := e.outcome(fmt.Sprintf("q%d", i))
			if o.Duplicate != 0 {
				t.Fatalf("job q%d delivered %d twice", i, o.Duplicate)
			}
			it := o.Delivered.Iterator()
			for it.HasNext() {
				per[it.Next()]++
			}
		}
		for u := uint32(1); u <= 2000; u++ {
			if n := per[u]; n > releasedAfter || n > quota.PerDay || n < min(jobs, releasedBefore) {
				t.Fatalf("user %d got %d messages; released %d..%d of %d", u, n, releasedBefore, releasedAfter, quota.PerDay)
			}
			if got := e.stack.Planner.Quota(u); got != per[u] {
				t.Fatalf("planner counts %d for user %d, reports say %d", got, u, per[u])
			}
		}
		t.Logf("9 jobs, %d units released: every user got %d", releasedAfter, per[1])
	})
}

// An executor drained mid-job finishes what it holds and leaves; the other
// takes the rest; the drained one comes back and is used again.
func TestDrainExecutor(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		cfg := testConfig()
		cfg.MaxBacklog = 1
		e := start(t, b, cfg, func(s *app.Stack) {
			publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.CRC))}))
		})
		users := rangeSet(1, 30001)
		e.logins(true, users.ToArray()...)
		e.waitOnline(30000)
		e.submit(&pb.SendJob{JobId: "d", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c", ContentCrc: 5,
			InlinePackage: inline(t, users)})
		x0 := e.stack.Executors[0]
		deadline := time.Now().Add(60 * time.Second)
		for units, _, _ := x0.Stats(); units == 0; units, _, _ = x0.Stats() {
			if time.Now().After(deadline) {
				t.Fatal("exec-0 got no unit")
			}
			time.Sleep(10 * time.Millisecond)
		}
		x0.Drain()
		for !x0.Drained() {
			if time.Now().After(deadline) {
				t.Fatal("exec-0 did not finish draining")
			}
			time.Sleep(20 * time.Millisecond)
		}
		atDrain, _, _ := x0.Stats()
		e.waitState("d", pb.JobState_COMPLETED)
		if after, _, _ := x0.Stats(); after != atDrain {
			t.Fatalf("drained executor ran %d more units", after-atDrain)
		}
		o := e.outcome("d")
		if o.Duplicate != 0 || !o.Delivered.Equals(users) {
			t.Fatalf("delivered %d (dup %d) of %d", o.Delivered.GetCardinality(), o.Duplicate, users.GetCardinality())
		}
		if u1, _, _ := e.stack.Executors[1].Stats(); u1 == 0 {
			t.Fatal("the other executor took nothing")
		}
		t.Logf("exec-0 ran %d units before draining; the job finished on exec-1", atDrain)
		// Back from the upgrade: the same name, the same queue.
		back := e.stack.StartExecutor(e.ctx, "exec-0")
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		if err := e.stack.WaitReady(ctx, 2); err != nil {
			t.Fatal(err)
		}
		e.submit(&pb.SendJob{JobId: "d2", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c2", ContentCrc: 6,
			InlinePackage: inline(t, users)})
		e.waitState("d2", pb.JobState_COMPLETED)
		if u, _, _ := back.Stats(); u == 0 {
			t.Fatal("the returned executor was given nothing")
		}
	})
}

// transitions reads a job's committed transitions in order.
func (e *env) transitions(id string) []*pb.JobTransition {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*pb.JobTransition
	err := streams.ReadToEnd(ctx, e.b.Kafka, e.ns+schemas.TopicJobTransitions, func(r *kgo.Record) error {
		var t pb.JobTransition
		if streams.Decode(r, &t) == nil && t.JobId == id {
			out = append(out, &t)
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func has(ts []*pb.JobTransition, s pb.JobState) bool {
	for _, t := range ts {
		if t.To == s {
			return true
		}
	}
	return false
}

// A low-priority job sending on a busy executor pool is pre-empted by a
// higher one and resumes after it; a real-time job never is. A job that
// fits on one executor goes to one executor.
func TestPriorityPreemptionAndPlacement(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		cfg := testConfig()
		cfg.MaxBacklog = 1
		e := start(t, b, cfg, func(s *app.Stack) {
			publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.CRC))}))
		})
		users := rangeSet(1, 40001)
		e.logins(true, users.ToArray()...)
		e.waitOnline(40000)
		job := func(id string, crc uint32, prio int32, rt bool, set *roaring.Bitmap) {
			e.submit(&pb.SendJob{JobId: id, AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: id, ContentCrc: crc,
				Priority: prio, Realtime: rt, InlinePackage: inline(t, set)})
		}
		job("low", 1, 1, false, users)
		e.waitState("low", pb.JobState_SENDING)
		job("rt", 2, 0, true, users) // real-time beats any priority
		job("high", 3, 9, false, users)
		for _, id := range []string{"low", "rt", "high"} {
			e.waitState(id, pb.JobState_COMPLETED)
		}
		low, rt, high := e.transitions("low"), e.transitions("rt"), e.transitions("high")
		if !has(low, pb.JobState_PREEMPTED) || !has(low, pb.JobState_RESUMING) {
			t.Fatalf("low-priority job was not pre-empted and resumed: %v", states(low))
		}
		if has(rt, pb.JobState_PREEMPTED) {
			t.Fatalf("real-time job was pre-empted: %v", states(rt))
		}
		// The real-time job finished before the high one, which finished
		// before the low one.
		end := func(ts []*pb.JobTransition) int64 { return ts[len(ts)-1].AtMs }
		if !(end(rt) <= end(high) && end(high) <= end(low)) {
			t.Fatalf("finish order rt %d, high %d, low %d", end(rt), end(high), end(low))
		}
		for _, id := range []string{"low", "rt", "high"} {
			if o := e.outcome(id); o.Duplicate != 0 || !o.Delivered.Equals(users) {
				t.Fatalf("%s delivered %d (dup %d)", id, o.Delivered.GetCardinality(), o.Duplicate)
			}
		}
		// A one-unit job fits one executor: it is placed on exactly one.
		job("small", 4, 5, false, rangeSet(1, 301))
		e.waitState("small", pb.JobState_COMPLETED)
		for _, tr := range e.transitions("small") {
			if tr.To == pb.JobState_SENDING && strings.Contains(tr.Executor, ",") {
				t.Fatalf("a job that fits one executor was split: %s", tr.Executor)
			}
		}
	})
}

func states(ts []*pb.JobTransition) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.To.String())
	}
	return out
}

// A big account's followers come from the mirror fed by push.fan-delta
// while it validates, and from the source store once it has drifted.
func TestFanListMirrorAndFallback(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns := streamstest.Unique("t") + "."
		s := app.New(b.Kafka, app.Options{Namespace: ns, Dir: t.TempDir(), Executors: 1, Planner: testConfig(),
			MirrorThreshold: 1000, Log: quiet()})
		ctx, cancel := context.WithCancel(context.Background())
		defer func() { cancel(); _ = s.Wait() }()
		if err := s.CreateTopics(ctx, streams.OneCopy); err != nil {
			t.Fatal(err)
		}
		publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 7, Filters: proto.Uint32(uint32(filter.Relation))}))
		cl := streamstest.Client(t, b.Kafka)
		var recs []*kgo.Record
		for u := uint32(1); u <= 20000; u++ {
			recs = append(recs, directory.FollowRecord(ns, 7, u, true))
		}
		streamstest.ProduceSync(t, cl, recs...)
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		e := &env{t: t, ctx: ctx, ns: ns, b: b, cl: cl, stack: s}
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		defer wcancel()
		if err := s.WaitReady(wctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Applied(wctx); err != nil {
			t.Fatal(err)
		}
		reasonOf := func(id string) string {
			for _, tr := range e.transitions(id) {
				if tr.To == pb.JobState_PACKAGE_READY {
					return tr.Reason
				}
			}
			return ""
		}
		e.submit(&pb.SendJob{JobId: "m1", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c", ContentCrc: 1})
		e.waitState("m1", pb.JobState_COMPLETED)
		if r := reasonOf("m1"); r != "targets from mirror" {
			t.Fatalf("first job: %q", r)
		}
		// 30% of the followers leave, published on push.fan-delta: the
		// mirror follows the topic. (Sampling's fallback on a mirror that
		// drifted from its source is in fanlist's tests.)
		recs = recs[:0]
		for u := uint32(1); u <= 6000; u++ {
			recs = append(recs, directory.FollowRecord(ns, 7, u, false))
		}
		publish(t, s, recs...)
		if err := s.Applied(wctx); err != nil {
			t.Fatal(err)
		}
		e.submit(&pb.SendJob{JobId: "m2", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c", ContentCrc: 2})
		e.waitState("m2", pb.JobState_COMPLETED)
		if r := reasonOf("m2"); r != "targets from mirror" {
			t.Fatalf("second job: %q", r)
		}
		// It reached exactly the current followers (nobody online, so all
		// went to the offline queues).
		if q := offlineQueued(t, b.Kafka, ns, "m2"); !q.Equals(rangeSet(6001, 20001)) {
			t.Fatalf("targeted %d users, want 14000", q.GetCardinality())
		}
	})
}

// An account's daily job quota follows its last delivery's click-through
// (push.clicks counted by push-ctr onto push.job-clicks): with no clicks
// on its first delivery an account with a base of 4 jobs a day may send
// only 1 (a quarter), so its second job is refused; once clicks show a
// 20% rate (four times the 5% target) it may send 8, and the next job
// goes out.
func TestQuotaFollowsClickThrough(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := start(t, b, testConfig(), func(s *app.Stack) {
			publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 5, DailyJobs: 4,
				Filters: proto.Uint32(uint32(filter.CRC))}))
		})
		pkg := rangeSet(1, 201)
		e.submit(&pb.SendJob{JobId: "c1", AccountId: 5, Source: pb.TargetSource_PACKAGE, ContentId: "c1", ContentCrc: 1, InlinePackage: inline(t, pkg)})
		e.waitState("c1", pb.JobState_COMPLETED)
		lastDelivery := func(clicks uint64) {
			t.Helper()
			deadline := time.Now().Add(60 * time.Second)
			for {
				if j, ok := e.stack.Directory.LastDelivery(5); ok && j.JobId == "c1" && j.Clicks == clicks && j.Targets == 200 {
					return
				}
				if time.Now().After(deadline) {
					j, _ := e.stack.Directory.LastDelivery(5)
					t.Fatalf("the planner's view of account 5's last delivery: %v, want c1 with %d clicks of 200", j, clicks)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		lastDelivery(0)
		e.submit(&pb.SendJob{JobId: "c2", AccountId: 5, Source: pb.TargetSource_PACKAGE, ContentId: "c2", ContentCrc: 2, InlinePackage: inline(t, pkg)})
		e.waitState("c2", pb.JobState_REJECTED)
		var clicks []*kgo.Record
		for u := uint64(1); u <= 40; u++ {
			r, err := streams.NewRecord(e.ns+schemas.TopicClicks, []byte("c1"), &pb.ClickEvent{JobId: "c1", AccountId: 5, Uin: u})
			if err != nil {
				t.Fatal(err)
			}
			clicks = append(clicks, r)
		}
		streamstest.ProduceSync(t, e.cl, clicks...)
		lastDelivery(40)
		e.submit(&pb.SendJob{JobId: "c3", AccountId: 5, Source: pb.TargetSource_PACKAGE, ContentId: "c3", ContentCrc: 3, InlinePackage: inline(t, pkg)})
		e.waitState("c3", pb.JobState_COMPLETED)
		var why string
		for _, tr := range e.transitions("c2") {
			if tr.To == pb.JobState_REJECTED {
				why = tr.Reason
			}
		}
		if !strings.Contains(why, "daily job limit: account 5 sent its 1 jobs today") {
			t.Errorf("c2 rejected for %q, want the click-through limit of 1", why)
		}
	})
}
