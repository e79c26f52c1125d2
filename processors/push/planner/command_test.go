package planner

import (
	"strings"
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// Operators pause, resume and cancel jobs through push.job-commands: a
// paused job gets no more units while its executor has room, and resumed
// it finishes with every unit sent once; a cancelled job gives its
// undispatched targets their quota (and the CRC mark) back; commands that
// do not apply are dead-lettered with the reason; and a planner restored
// from the transitions holds the same memory as the live one.
func TestPauseResumeCancel(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x")
		ctx := e.ctx
		// Late in the day every quota window is released, whenever the test runs.
		y, m, d := time.Now().Date()
		late := time.Date(y, m, d, 23, 30, 0, 0, time.Local)
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.MinLead, cfg.CheckpointEvery = 100, 2, time.Second, 0
		cfg.Now = func() time.Time { return late }
		live := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		x := &fakeExecutor{holdBack: map[string]bool{"p": true, "c": true}}
		stopRun := e.run(live, x)
		send, wait := e.send, func(id string, want pb.JobState) { t.Helper(); e.wait(live, id, want) }
		command := func(id string, op pb.JobCommand_Op) {
			send(schemas.TopicJobCommands, id, &pb.JobCommand{JobId: id, Op: op, RequestedBy: "test"})
		}
		ns, pkgs, log := e.ns, e.pkgs, e.log

		// Pause: two units are out (the executor holds them); once it has
		// room again, still nothing more goes to the paused job.
		send(schemas.TopicJobs, "p", &pb.SendJob{JobId: "p", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c1", ContentCrc: 1})
		wait("p", pb.JobState_SENDING)
		command("p", pb.JobCommand_PAUSE)
		wait("p", pb.JobState_PAUSED)
		x.release("p")
		time.Sleep(2 * time.Second)
		if n, _ := x.received("p"); n != 2 {
			t.Fatalf("paused job: %d units dispatched, want the 2 out before the pause", n)
		}
		command("p", pb.JobCommand_RESUME)
		wait("p", pb.JobState_COMPLETED)
		if n, twice := x.received("p"); n != 9 || twice {
			t.Fatalf("resumed job: %d distinct units (twice: %v), want all 9 once", n, twice)
		}

		// Cancel: two units out, seven never dispatched.
		send(schemas.TopicJobs, "c", &pb.SendJob{JobId: "c", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c2", ContentCrc: 2})
		wait("c", pb.JobState_SENDING)
		command("c", pb.JobCommand_CANCEL)
		wait("c", pb.JobState_CANCELLED)
		// Targets are dispatched by rank: uin 1 was in unit 0, uin 900 in unit 8.
		if got := live.Quota(1); got != 2 {
			t.Errorf("uin 1 (reached by p and by c's first unit): quota %d, want 2", got)
		}
		if got := live.Quota(900); got != 1 {
			t.Errorf("uin 900 (c never reached it): quota %d, want 1 (c's unit given back)", got)
		}
		// The same content again reaches only those c never reached (once
		// the executor finished c's two units and has room).
		x.release("c")
		send(schemas.TopicJobs, "c-again", &pb.SendJob{JobId: "c-again", AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: "c2", ContentCrc: 2})
		wait("c-again", pb.JobState_COMPLETED)

		// Commands that do not apply.
		command("nobody", pb.JobCommand_PAUSE)
		command("p", pb.JobCommand_CANCEL)                              // completed
		command("c", pb.JobCommand_RESUME)                              // cancelled
		send(schemas.TopicJobCommands, "p", &pb.JobCommand{JobId: "p"}) // no op
		dead := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicDeadLetter, true, 4, 30*time.Second, time.Second)
		var reasons []string
		for _, r := range dead {
			if v, ok := streams.Header(r, "dlq-reason"); ok {
				reasons = append(reasons, v)
			}
		}
		for _, want := range []string{`PAUSE of unknown job "nobody"`, "cannot cancel job p: it is COMPLETED", "cannot resume job c: it is CANCELLED", "want PAUSE, RESUME or CANCEL"} {
			found := false
			for _, r := range reasons {
				found = found || strings.Contains(r, want)
			}
			if !found {
				t.Errorf("no dead letter saying %q in %q", want, reasons)
			}
		}
		time.Sleep(500 * time.Millisecond)
		stopRun()

		restored := New(withEnv(cfg, b.Kafka, pkgs, ns, log))
		if err := restored.Restore(ctx); err != nil {
			t.Fatal(err)
		}
		if a, b := memory(t, live), memory(t, restored); a != b {
			t.Fatalf("restored memory differs from the live one:\nlive:\n%s\nrestored:\n%s", a, b)
		}
		unitsOfAgain, _ := x.received("c-again")
		if unitsOfAgain != 7 {
			t.Errorf("c-again went out in %d units, want 7 (the 700 targets c never reached)", unitsOfAgain)
		}
	})
}
