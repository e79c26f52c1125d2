package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// SIGTERM, or `surge push drain --executor NAME`, drains an executor for
// an upgrade: in the middle of a job it stops taking units, finishes those
// it holds and exits 0; the other executor sends the rest, and every
// target gets exactly one message. The signal is tried on kfake, the
// command on the real broker.
func TestExecutorDrainsOnSIGTERM(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		bed := newPushBed(t, ctx, b, "drain", "SURGE_PUSH_UNIT_SIZE=200", "SURGE_PUSH_MAX_BACKLOG=2", "SURGE_LOG_LEVEL=info")
		ns, cl, env := bed.ns, bed.cl, bed.env
		target := bed.onlineFollowers(40000)
		bed.run("presence", "push-presence", "--processor.instance_id=pres")
		bed.run("planner", "push-planner", "--processor.instance_id=pl")
		exA := bed.run("executor-a", "push-executor", "--push.executor_name=ea")
		bed.run("executor-b", "push-executor", "--push.executor_name=eb")
		// Both executors report before the job goes out: one that loads its
		// online bitmap late would otherwise find the job already sent.
		bed.ready(ctx, "ea", "eb")
		job := &pb.SendJob{JobId: "j1", AccountId: 1, Source: pb.TargetSource_FOLLOWERS, ContentId: "c1", ContentCrc: 1, Realtime: true}
		jr, _ := streams.NewRecord(ns+schemas.TopicJobs, []byte(job.JobId), job)
		streamstest.ProduceSync(t, cl, jr)

		waitFor(t, ctx, "first delivery by executor a", func() bool { return byExecutor(t, b.Kafka, ns, "j1")["ea"] > 0 })
		if b.Real {
			if out, errOut, err := command(t, env, "push", "drain", "--executor", "ea", "--reason", "upgrade"); err != nil {
				t.Fatalf("surge push drain: %v\n%s%s", err, out, errOut)
			}
		} else if err := exA.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- exA.cmd.Wait() }()
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("executor a after its drain: %v (want exit 0 once drained)", err)
			}
		case <-ctx.Done():
			t.Fatal("executor a did not exit after its drain")
		}
		exA.mu.Lock()
		drained := strings.Contains(exA.log.String(), "executor: drained")
		exA.mu.Unlock()
		if !drained {
			t.Fatal("executor a exited without draining")
		}
		atExit := byExecutor(t, b.Kafka, ns, "j1")["ea"]

		waitFor(t, ctx, "job completed", func() bool { return stateOf(t, b.Kafka, ns, "j1") == pb.JobState_COMPLETED })
		time.Sleep(time.Second) // anything sent twice would have arrived by now
		r := reportsOf(t, ns, b.Kafka, "j1")
		if r.twice != 0 || !r.reached.Equals(target) {
			t.Fatalf("reached %d of %d targets, %d twice", r.reached.GetCardinality(), target.GetCardinality(), r.twice)
		}
		per := byExecutor(t, b.Kafka, ns, "j1")
		if per["ea"] != atExit || per["eb"] == 0 {
			t.Fatalf("deliveries per executor %v; executor a had %d when it exited (it must take nothing after)", per, atExit)
		}
	})
}

// byExecutor counts a job's delivery reports per executor.
func byExecutor(t *testing.T, kc streams.Cluster, ns, jobID string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string]int{}
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicReports, func(r *kgo.Record) error {
		var rep pb.DeliveryReport
		if streams.Decode(r, &rep) == nil && rep.JobId == jobID && rep.Status == pb.DeliveryStatus_DELIVERED {
			out[rep.Executor]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
