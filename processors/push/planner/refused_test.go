package planner

import (
	"testing"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams/streamstest"
)

// A unit an executor refuses (its record unreadable) is done, not sent:
// the job does not wait for it forever, it ends PARTIALLY_COMPLETED, and
// the refused unit's targets get their quota and CRC mark back while the
// others keep theirs. A restore rebuilds the same memory.
func TestRefusedUnitGivesItsTargetsBack(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x")
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery = 100, 4, 0
		cfg.Now = lateClock()
		p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		x := &fakeExecutor{refuse: map[string]uint32{"r": 2}} // uins 201..300
		stop := e.run(p, x)
		e.send(schemas.TopicJobs, "r", &pb.SendJob{JobId: "r", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "r", ContentCrc: 5})
		e.wait(p, "r", pb.JobState_PARTIALLY_COMPLETED)
		if n, twice := x.received("r"); n != 9 || twice {
			t.Fatalf("r: %d units (twice %v), want 9 once", n, twice)
		}
		for uin, want := range map[uint32]int{1: 1, 200: 1, 201: 0, 300: 0, 301: 1, 900: 1} {
			if got := p.Quota(uin); got != want {
				t.Errorf("uin %d: quota %d, want %d", uin, got, want)
			}
		}
		// The same content again reaches only the refused unit's targets.
		e.send(schemas.TopicJobs, "again", &pb.SendJob{JobId: "again", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "r", ContentCrc: 5})
		e.wait(p, "again", pb.JobState_COMPLETED)
		if n, _ := x.received("again"); n != 1 {
			t.Fatalf("the same content again: %d units, want 1 (the 100 refused targets)", n)
		}
		stop()
		e.sameAfterRestore(p, cfg)
	})
}
