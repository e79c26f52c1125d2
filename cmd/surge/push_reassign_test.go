package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/directory"
	push "surge/processors/push/pipeline"
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
		ns, dir := streamstest.Unique("reassign")+".", t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cl := streamstest.Client(t, b.Kafka, kgo.ProducerBatchMaxBytes(1<<20))
		if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, push.Topics(ns)...); err != nil {
			t.Fatal(err)
		}
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_PUSH_NAMESPACE=" + ns,
			"SURGE_PUSH_UNIT_SIZE=500", "SURGE_PUSH_MAX_BACKLOG=3", "SURGE_LOG_LEVEL=info"}
		in := func(name string) string { return "--push.dir=" + dir + "/" + name }

		const users = 20000 // 40 units
		target := roaring.New()
		target.AddRange(1, users+1)
		recs := []*kgo.Record{directory.AccountRecord(ns, &pb.AccountInfo{AccountId: 1, Type: "subscription", Followers: users})}
		for u := uint32(1); u <= users; u++ {
			recs = append(recs, directory.FollowRecord(ns, 1, u, true))
			r, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
			recs = append(recs, r)
		}
		streamstest.ProduceSync(t, cl, recs...)

		runService(t, env, "presence", "push-presence", "--processor.instance_id=pres", in("pres"))
		runService(t, env, "planner", "push-planner", "--processor.instance_id=pa", in("pa"))
		ea := runService(t, env, "executor-a", "push-executor", "--push.executor_name=ea", in("ea"))
		runService(t, env, "executor-b", "push-executor", "--push.executor_name=eb", in("eb"))
		if err := streams.WaitConsumed(ctx, b.Kafka, push.PlannerGroup(ns), directory.New(ns).Topics()...); err != nil {
			t.Fatal(err)
		}
		if err := streams.WaitConsumed(ctx, b.Kafka, ns+"presence", ns+schemas.TopicLogin); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "both executors reporting", func() bool {
			seen := map[string]bool{}
			_ = streams.ReadToEnd(ctx, b.Kafka, ns+schemas.TopicExecutors, func(r *kgo.Record) error {
				seen[string(r.Key)] = true
				return nil
			})
			return seen["ea"] && seen["eb"]
		})

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
