package planner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/numpkg"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// fakeExecutor reports load for one executor and finishes the units it is
// sent, except those of the jobs it holds back (they stay SENDING).
type fakeExecutor struct {
	t        *testing.T
	ns       string
	kafka    streams.Cluster
	name     string // "x" when empty
	capacity uint64 // reported CapacityUins
	mu       sync.Mutex
	draining bool              // reported: finishing its units, taking no more
	silent   bool              // as if killed: reports nothing, sends nothing
	refuse   map[string]uint32 // job -> a unit it reports refused (not sent)
	holdBack map[string]bool
	held     []*pb.SendTaskUnit        // units of held-back jobs, not finished
	units    map[string]map[uint32]int // units received per job (and how often)
}

// release finishes job's held units and every later one.
func (x *fakeExecutor) release(job string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.holdBack[job] = false
}

// received is how many distinct units of job arrived, and whether one
// arrived twice.
func (x *fakeExecutor) received(job string) (n int, twice bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, c := range x.units[job] {
		n++
		twice = twice || c > 1
	}
	return n, twice
}

func (x *fakeExecutor) run(ctx context.Context) {
	if x.name == "" {
		x.name = "x"
	}
	cl := streamstest.Client(x.t, x.kafka, kgo.ConsumeTopics(x.ns+schemas.TopicUnits+"."+x.name),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DefaultProduceTopic(x.ns+schemas.TopicExecutors))
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		x.mu.Lock()
		draining, silent := x.draining, x.silent
		x.mu.Unlock()
		if silent {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
			continue
		}
		recs := []*kgo.Record{x.load(&pb.ExecutorLoad{Executor: x.name, UnitsTopic: x.ns + schemas.TopicUnits + "." + x.name,
			CapacityUins: x.capacity, Draining: draining, AtMs: time.Now().UnixMilli()})}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		f := cl.PollFetches(pctx)
		cancel()
		x.mu.Lock()
		f.EachRecord(func(r *kgo.Record) {
			u := new(pb.SendTaskUnit)
			if streams.Decode(r, u) != nil || u.Revoked {
				return
			}
			if x.units == nil {
				x.units = map[string]map[uint32]int{}
			}
			if x.units[u.JobId] == nil {
				x.units[u.JobId] = map[uint32]int{}
			}
			x.units[u.JobId][u.UnitId]++
			x.held = append(x.held, u)
		})
		kept := x.held[:0]
		for _, u := range x.held {
			if x.holdBack[u.JobId] {
				kept = append(kept, u)
				continue
			}
			refused := false
			if k, ok := x.refuse[u.JobId]; ok && k == u.UnitId {
				refused = true
			}
			recs = append(recs, x.load(&pb.ExecutorLoad{Executor: x.name, DoneJobId: u.JobId, DoneUnitId: u.UnitId, DoneUins: u.Count, DoneRefused: refused}))
		}
		x.held = kept
		x.mu.Unlock()
		if ctx.Err() == nil {
			_ = cl.ProduceSync(ctx, recs...).FirstErr()
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

func (x *fakeExecutor) load(l *pb.ExecutorLoad) *kgo.Record {
	r, err := streams.NewRecord(x.ns+schemas.TopicExecutors, []byte(x.name), l)
	if err != nil {
		x.t.Fatal(err)
	}
	return r
}

// memory is a planner's memory in a form two planners can be compared by.
func memory(t *testing.T, p *Planner) string {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	st, err := p.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	st.TransitionsNext = nil
	slices.SortFunc(st.Open, func(a, b *pb.PlannerOpenJob) int { return cmpString(a.Job.JobId, b.Job.JobId) })
	slices.SortFunc(st.Sent, func(a, b *pb.ContentSent) int { return int(a.Crc) - int(b.Crc) })
	// Bitmaps compare by content, not by their serialization.
	var b []byte
	for _, s := range st.Sent {
		bm := roaring.New()
		if err := bm.UnmarshalBinary(s.Uins); err != nil {
			t.Fatal(err)
		}
		b = fmt.Appendf(b, "sent %d: %v\n", s.Crc, bm.ToArray())
		s.Uins = nil
	}
	for i, l := range st.QuotaLevels {
		bm := roaring.New()
		if err := bm.UnmarshalBinary(l); err != nil {
			t.Fatal(err)
		}
		b = fmt.Appendf(b, "quota level %d: %v\n", i+1, bm.ToArray())
	}
	st.QuotaLevels = nil
	ids := make([]string, 0, len(p.queue))
	for id := range p.queue {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		q := p.queue[id]
		b = fmt.Appendf(b, "queued %s: state %s next %d of %d, done %d, targets %d\n", id, q.state, q.next, q.units, len(q.done), q.total)
	}
	text, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s%x", b, text)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A planner restored from its newest checkpoint and the transitions after
// it holds the same memory as one that replays every transition, and
// reads far fewer of them.
func TestRestoreFromCheckpointEqualsFullReplay(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x")
		ctx, ns, pkgs, log := e.ctx, e.ns, e.pkgs, e.log
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.MinLead, cfg.CheckpointEvery = 100, 4, time.Second, 300*time.Millisecond
		cfg.Now = lateClock() // no job waits for quota, whatever the hour
		live := New(withEnv(cfg, b.Kafka, pkgs, ns, log))
		stopRun := e.run(live, &fakeExecutor{holdBack: map[string]bool{"held": true, "tail-held": true}})
		submit := func(j *pb.SendJob) { e.send(schemas.TopicJobs, j.JobId, j) }
		wait := func(id string, want pb.JobState) { t.Helper(); e.wait(live, id, want) }
		pkg := func(lo, hi uint32) []byte {
			bm := roaring.New()
			bm.AddRange(uint64(lo), uint64(hi))
			data, err := numpkg.Encode(bm)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
		// Before the checkpoint: jobs that complete, one held SENDING, one
		// scheduled, one refused; CRC and quota state build up. Held jobs
		// are real-time, so the quota released at this hour cannot empty them.
		submit(&pb.SendJob{JobId: "done-1", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c1", ContentCrc: 1, Realtime: true})
		wait("done-1", pb.JobState_COMPLETED)
		submit(&pb.SendJob{JobId: "done-2", AccountId: 7, Source: pb.TargetSource_PACKAGE, InlinePackage: pkg(500, 1500), ContentId: "c2", ContentCrc: 2})
		wait("done-2", pb.JobState_COMPLETED)
		submit(&pb.SendJob{JobId: "held", AccountId: 7, Source: pb.TargetSource_PACKAGE, InlinePackage: pkg(100, 350), ContentId: "c3", ContentCrc: 3, Realtime: true})
		wait("held", pb.JobState_SENDING)
		submit(&pb.SendJob{JobId: "later", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c4", ContentCrc: 4,
			CreatedAtMs: cfg.Now().UnixMilli(), ScheduledAtMs: cfg.Now().Add(time.Hour).UnixMilli()})
		wait("later", pb.JobState_WAITING_SCHEDULE)
		submit(&pb.SendJob{JobId: "refused", AccountId: 99, Source: pb.TargetSource_FOLLOWERS, ContentId: "c5"})
		wait("refused", pb.JobState_REJECTED)

		// A checkpoint after all of that, then a tail after the checkpoint.
		mark := cfg.Now()
		for {
			live.mu.Lock()
			last := live.ckpt.last
			live.mu.Unlock()
			if last.After(mark) {
				break
			}
			if ctx.Err() != nil {
				t.Fatal("no checkpoint was written")
			}
			time.Sleep(20 * time.Millisecond)
		}
		live.mu.Lock()
		live.cfg.CheckpointEvery = time.Hour // no more: the tail must be replayed
		live.mu.Unlock()
		submit(&pb.SendJob{JobId: "tail-done", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c9", ContentCrc: 9})
		wait("tail-done", pb.JobState_COMPLETED)
		submit(&pb.SendJob{JobId: "tail-held", AccountId: 7, Source: pb.TargetSource_PACKAGE, InlinePackage: pkg(600, 750), ContentId: "c6", ContentCrc: 6, Realtime: true})
		wait("tail-held", pb.JobState_SENDING)
		time.Sleep(500 * time.Millisecond) // the executor's last completions land
		stopRun()

		restored := func(every time.Duration) *Planner {
			c := cfg
			c.CheckpointEvery = every
			p := New(withEnv(c, b.Kafka, pkgs, ns, log))
			if err := p.Restore(ctx); err != nil {
				t.Fatal(err)
			}
			return p
		}
		full, fromCkpt := restored(0), restored(time.Minute)
		fs, cs := full.LastRestore(), fromCkpt.LastRestore()
		t.Logf("full replay: %d transitions in %s; checkpoint: %d transitions in %s", fs.Transitions, fs.Took, cs.Transitions, cs.Took)
		if fs.FromCheckpoint || !cs.FromCheckpoint {
			t.Fatalf("from checkpoint: full %v, checkpointed %v", fs.FromCheckpoint, cs.FromCheckpoint)
		}
		// The replay is exactly the transitions after the checkpoint's
		// position, and those hold every transition of the jobs submitted
		// after it. (Not only theirs: the batch that writes a checkpoint
		// may carry an older job's transitions, which come after the
		// memory it holds.)
		st, _, ok, err := New(withEnv(cfg, b.Kafka, pkgs, ns, log)).loadCheckpoint(ctx, b.Kafka)
		if err != nil || !ok {
			t.Fatalf("no checkpoint to read: %v", err)
		}
		after, tail, tailBefore := 0, 0, 0
		if err := streams.ReadToEnd(ctx, b.Kafka, ns+schemas.TopicJobTransitions, func(r *kgo.Record) error {
			past := r.Offset >= st.TransitionsNext[r.Partition]
			if past {
				after++
			}
			if strings.HasPrefix(string(r.Key), "tail-") {
				tail++
				if !past {
					tailBefore++
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if tail == 0 || tailBefore > 0 || cs.Transitions != after || fs.Transitions <= after {
			t.Fatalf("the checkpointed restore replayed %d of %d transitions, want the %d after the checkpoint (%d of the tail's %d before it)",
				cs.Transitions, fs.Transitions, after, tailBefore, tail)
		}
		if a, b := memory(t, full), memory(t, fromCkpt); a != b {
			t.Fatalf("memories differ:\nfull replay:\n%s\nfrom checkpoint:\n%s", a, b)
		}
		if got := fromCkpt.State("later"); got != pb.JobState_WAITING_SCHEDULE {
			t.Fatalf("scheduled job restored as %s", got)
		}
		if fromCkpt.Queued() != 2 {
			t.Fatalf("restored queue has %d jobs, want the 2 held", fromCkpt.Queued())
		}
	})
}
