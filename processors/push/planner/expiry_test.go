package planner

import (
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams/streamstest"
)

// A job with a deadline stops at it: one that had units out ends
// PARTIALLY_COMPLETED once they are done, with no more sent; one that
// never got an executor ends EXPIRED; a job already past its deadline is
// refused. Targets never reached get their quota back, and a restore
// rebuilds the same memory.
func TestJobsStopAtTheirDeadline(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x")
		// A clock late in the day (every quota window released) that runs.
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery = 100, 2, 0
		cfg.Now = lateClock()
		p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		x := &fakeExecutor{holdBack: map[string]bool{"p": true}}
		stop := e.run(p, x)
		// The deadline counts from when x reports (a busy machine may take
		// seconds to start it), and leaves p time to get its units out.
		for end := time.Now().Add(30 * time.Second); p.LiveExecutors() == 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("executor x never reported")
			}
		}
		deadline := cfg.Now().Add(6 * time.Second).UnixMilli()
		job := func(id string, crc uint32, expires int64) {
			e.send(schemas.TopicJobs, id, &pb.SendJob{JobId: id, AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: id, ContentCrc: crc, ExpiresAtMs: expires})
		}
		job("p", 1, deadline)
		e.wait(p, "p", pb.JobState_SENDING) // two units out, held
		job("q", 2, deadline)               // no room: queued behind p
		e.wait(p, "q", pb.JobState_QUEUED)
		job("late", 3, cfg.Now().Add(-time.Minute).UnixMilli())
		e.wait(p, "late", pb.JobState_REJECTED)

		e.wait(p, "q", pb.JobState_EXPIRED)
		if st := p.State("p"); st != pb.JobState_SENDING {
			t.Fatalf("p past its deadline with units out: %s, want SENDING until they are done", st)
		}
		x.release("p")
		e.wait(p, "p", pb.JobState_PARTIALLY_COMPLETED)
		time.Sleep(500 * time.Millisecond)
		if n, _ := x.received("p"); n != 2 {
			t.Fatalf("p: %d units went out, want the 2 out before its deadline", n)
		}
		if n, _ := x.received("q"); n != 0 {
			t.Fatalf("q: %d units went out, want none", n)
		}
		// uin 1 got p's first unit; uin 900 (p's ninth unit, q's ninth) got nothing.
		if got := p.Quota(1); got != 1 {
			t.Errorf("uin 1: quota %d, want 1 (p's message; q's unit given back)", got)
		}
		if got := p.Quota(900); got != 0 {
			t.Errorf("uin 900: quota %d, want 0 (neither job reached it)", got)
		}
		stop()
		e.sameAfterRestore(p, cfg)
	})
}
