package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// An executor process that stops while it holds units (SIGSTOP: it
// neither reports nor sends) has them taken back on default settings and
// sent by the other executor: the job completes while it is stopped. When
// it wakes up (its transactions fenced), and again when it is killed with
// -9 and restarted under its name, it sends none of the units taken from
// it: every target gets the message exactly once.
func TestPushSilentExecutorsUnitsGoToOthers(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		bed := newPushBed(t, ctx, b, "reassign", "SURGE_PUSH_UNIT_SIZE=500", "SURGE_PUSH_MAX_BACKLOG=3", "SURGE_LOG_LEVEL=info")
		ns, cl := bed.ns, bed.cl
		target := bed.onlineFollowers(20000) // 40 units
		bed.run("presence", "push-presence", "--processor.instance_id=pres")
		bed.run("planner", "push-planner", "--processor.instance_id=pa")
		ea := bed.run("executor-a", "push-executor", "--push.executor_name=ea")
		bed.run("executor-b", "push-executor", "--push.executor_name=eb")
		bed.ready(ctx, "ea", "eb")

		// ea stops; the planner still counts it alive for a few seconds
		// (push.executor_timeout) and gives it units, which it holds.
		if err := ea.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		job, _ := streams.NewRecord(ns+schemas.TopicJobs, []byte("j1"), &pb.SendJob{JobId: "j1", AccountId: 1,
			Source: pb.TargetSource_FOLLOWERS, ContentId: "c1", ContentCrc: 1})
		streamstest.ProduceSync(t, cl, job)
		waitFor(t, ctx, "job completed while ea is stopped", func() bool { return stateOf(t, b.Kafka, ns, "j1") == pb.JobState_COMPLETED })
		t.Logf("job completed %s after ea stopped", time.Since(stopped).Round(100*time.Millisecond))

		revoked := 0
		_ = streams.ReadToEnd(ctx, b.Kafka, ns+schemas.TopicExecutors, func(r *kgo.Record) error {
			var l pb.ExecutorLoad
			if streams.Decode(r, &l) == nil && l.Executor == "ea" {
				revoked += len(l.Revoked)
			}
			return nil
		})
		if revoked == 0 {
			t.Fatal("no unit was taken back from the stopped executor: the test did not make it hold any")
		}

		// ea wakes up fenced, then is killed and comes back: neither sends
		// what was taken from it.
		if err := ea.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		ea.kill()
		ea.start()
		time.Sleep(8 * time.Second)
		r := reportsOf(t, ns, b.Kafka, "j1")
		if r.twice != 0 {
			t.Fatalf("%d messages delivered twice (%d units had been taken back from ea)", r.twice, revoked)
		}
		if !r.reached.Equals(target) {
			t.Fatalf("reached %d users, want the %d targets", r.reached.GetCardinality(), target.GetCardinality())
		}
	})
}
