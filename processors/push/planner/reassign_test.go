package planner

import (
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams/streamstest"
)

// An executor that stops reporting while it holds units of a job (killed,
// its machine gone, never back) has them taken back after ReassignAfter:
// they go to the executor that is alive, which gets nothing twice; the
// silent one gets nothing more; the job completes; and a restore rebuilds
// the same memory, holders included.
func TestSilentExecutorsUnitsGoToOthers(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x", "y")
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery, cfg.ReassignAfter = 100, 3, 0, 2*time.Second
		cfg.Now = lateClock()
		p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		x := &fakeExecutor{name: "x", holdBack: map[string]bool{"d": true}}
		y := &fakeExecutor{name: "y", holdBack: map[string]bool{"d": true}}
		stop := e.run(p, x, y)
		e.send(schemas.TopicJobs, "d", &pb.SendJob{JobId: "d", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "d", ContentCrc: 1})
		e.received(p, x, "d", 3)
		e.received(p, y, "d", 3)

		x.mu.Lock()
		x.silent = true // killed with its 3 units not sent
		x.mu.Unlock()
		silentAt := time.Now()
		y.release("d")
		e.wait(p, "d", pb.JobState_COMPLETED)
		took := time.Since(silentAt)

		nx, _ := x.received("d")
		ny, twice := y.received("d")
		if nx != 3 || ny != 9 || twice {
			t.Fatalf("units of d: the silent x got %d, y %d (twice %v); want 3, and all 9 on y once", nx, ny, twice)
		}
		if took < cfg.ReassignAfter {
			t.Fatalf("x's units went elsewhere %s after it fell silent, before ReassignAfter (%s)", took, cfg.ReassignAfter)
		}
		stop()
		e.sameAfterRestore(p, cfg)
	})
}

// A planner that takes over while an executor is silent knows from the
// topics (its checkpoint and the transitions: who holds which unit) what
// the silent one holds, and takes it back: the job completes on the live
// executor, every unit once.
func TestRestoredPlannerTakesBackASilentExecutorsUnits(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x", "y")
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery, cfg.ReassignAfter = 100, 3, 100*time.Millisecond, 2*time.Second
		cfg.Now = lateClock()
		x := &fakeExecutor{name: "x", holdBack: map[string]bool{"d": true}}
		y := &fakeExecutor{name: "y", holdBack: map[string]bool{"d": true}}
		first := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		stopFirst := e.runPlanner(first, "a")
		stopExecutors := e.run(nil, x, y)
		defer stopExecutors()
		e.send(schemas.TopicJobs, "d", &pb.SendJob{JobId: "d", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "d", ContentCrc: 1})
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			nx, _ := x.received("d")
			ny, _ := y.received("d")
			if nx == 3 && ny == 3 {
				break
			} else if time.Now().After(end) {
				t.Fatalf("x holds %d units of d and y %d, want 3 each (%s)", nx, ny, first.Describe("d"))
			}
		}
		time.Sleep(300 * time.Millisecond) // a checkpoint with the holders is written
		x.mu.Lock()
		x.silent = true
		x.mu.Unlock()
		stopFirst()

		second := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		stopSecond := e.runPlanner(second, "b")
		defer stopSecond()
		y.release("d")
		e.wait(second, "d", pb.JobState_COMPLETED)
		nx, _ := x.received("d")
		ny, twice := y.received("d")
		if nx != 3 || ny != 9 || twice {
			t.Fatalf("units of d: the silent x got %d, y %d (twice %v); want 3, and all 9 on y once", nx, ny, twice)
		}
		if st := second.restoreStats; !st.FromCheckpoint {
			t.Fatalf("the second planner did not restore from a checkpoint (%+v): the holders in it went untested", st)
		}
	})
}
