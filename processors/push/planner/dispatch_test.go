package planner

import (
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams/streamstest"
)

// Dispatch follows the load the executors report: an executor that takes
// 150 uins at once holds at most one 100-uin unit, while one without a
// limit of its own holds the planner's backlog of 4.
func TestDispatchWithinReportedCapacity(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "big", "small")
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery = 100, 4, 0
		p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		big := &fakeExecutor{name: "big", holdBack: map[string]bool{"j": true}}
		small := &fakeExecutor{name: "small", capacity: 150, holdBack: map[string]bool{"j": true}}
		stop := e.run(p, big, small)
		defer stop()
		for p.LiveExecutors() < 2 {
			time.Sleep(20 * time.Millisecond)
		}
		e.send(schemas.TopicJobs, "j", &pb.SendJob{JobId: "j", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c", ContentCrc: 1, Realtime: true})
		e.wait(p, "j", pb.JobState_SENDING)
		time.Sleep(time.Second) // heartbeats come and go: nothing more is dispatched while both are full
		nb, _ := big.received("j")
		ns, _ := small.received("j")
		if nb != 4 || ns != 1 {
			t.Fatalf("units in flight: big %d, small %d; want 4 and 1 (%s)", nb, ns, p.Describe("j"))
		}
		big.release("j")
		small.release("j")
		e.wait(p, "j", pb.JobState_COMPLETED)
		nb, _ = big.received("j")
		ns, _ = small.received("j")
		if nb+ns != 9 {
			t.Fatalf("%d + %d units, want the 9 of 900 targets", nb, ns)
		}
	})
}
