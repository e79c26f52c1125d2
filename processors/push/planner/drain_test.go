package planner

import (
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams/streamstest"
)

// drainSetup runs a planner with executors x and y, both holding back the
// units of job "d" until released: units of 100 targets, 2 per executor.
func drainSetup(t *testing.T, b streamstest.Backend) (*testEnv, Config, *Planner, *fakeExecutor, *fakeExecutor, func()) {
	e := newTestEnv(t, b, 900, "x", "y")
	cfg := DefaultConfig()
	cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery = 100, 2, 0
	cfg.Now = lateClock()
	p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
	x := &fakeExecutor{name: "x", holdBack: map[string]bool{"d": true}}
	ye := &fakeExecutor{name: "y", holdBack: map[string]bool{"d": true}}
	return e, cfg, p, x, ye, e.run(p, x, ye)
}

// A job with units on an executor that starts draining (leaving for an
// upgrade) goes DRAINING: the units there finish, nothing more of the job
// goes out meanwhile, not even to an executor with room; then it resumes
// and its remaining units go to the executors that stay. No unit is sent
// twice, and a restore rebuilds the same memory.
func TestDrainingExecutorHandsOverItsJob(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e, cfg, p, x, ye, stop := drainSetup(t, b)
		e.send(schemas.TopicJobs, "d", &pb.SendJob{JobId: "d", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "d", ContentCrc: 1})
		e.received(p, x, "d", 2)
		e.received(p, ye, "d", 2)
		e.wait(p, "d", pb.JobState_SENDING)

		x.mu.Lock()
		x.draining = true
		x.mu.Unlock()
		e.wait(p, "d", pb.JobState_DRAINING)
		ye.release("d") // y finishes its two and has room again
		time.Sleep(time.Second)
		if n, _ := ye.received("d"); n != 2 {
			t.Fatalf("y got %d units of d while x drained, want its first 2 only", n)
		}
		if st := p.State("d"); st != pb.JobState_DRAINING {
			t.Fatalf("d is %s while x still holds its units, want DRAINING", st)
		}

		x.release("d") // x's units finish: d resumes on y alone
		e.wait(p, "d", pb.JobState_COMPLETED)
		nx, twiceX := x.received("d")
		ny, twiceY := ye.received("d")
		if nx != 2 || ny != 7 || twiceX || twiceY {
			t.Fatalf("units of d: x %d (twice %v), y %d (twice %v); want 2 and 7, none twice", nx, twiceX, ny, twiceY)
		}
		stop()
		e.sameAfterRestore(p, cfg)
	})
}

// A DRAINING job answers an operator like a sending one: it can be paused
// (and resumed: it drains again while the executor still holds its units)
// and cancelled; once cancelled nothing more of it goes out.
func TestDrainingJobCanBePausedAndCancelled(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e, _, p, x, ye, stop := drainSetup(t, b)
		defer stop()
		e.send(schemas.TopicJobs, "d", &pb.SendJob{JobId: "d", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "d", ContentCrc: 1})
		command := func(op pb.JobCommand_Op) {
			e.send(schemas.TopicJobCommands, "d", &pb.JobCommand{JobId: "d", Op: op, RequestedBy: "test"})
		}
		e.wait(p, "d", pb.JobState_SENDING)
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if nx, _ := x.received("d"); nx == 2 {
				break
			} else if time.Now().After(end) {
				t.Fatalf("x holds %d units of d, want 2", nx)
			}
		}
		x.mu.Lock()
		x.draining = true
		x.mu.Unlock()
		e.wait(p, "d", pb.JobState_DRAINING)

		command(pb.JobCommand_PAUSE)
		e.wait(p, "d", pb.JobState_PAUSED)
		command(pb.JobCommand_RESUME)
		e.wait(p, "d", pb.JobState_DRAINING) // x still holds its units
		command(pb.JobCommand_CANCEL)
		e.wait(p, "d", pb.JobState_CANCELLED)

		x.release("d")
		ye.release("d")
		time.Sleep(time.Second)
		nx, _ := x.received("d")
		ny, _ := ye.received("d")
		if nx != 2 || ny > 2 {
			t.Fatalf("after the cancel: x got %d units of d, y %d; want 2 and at most 2", nx, ny)
		}
		if st := p.State("d"); st != pb.JobState_CANCELLED {
			t.Fatalf("d is %s, want CANCELLED", st)
		}
	})
}
