package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// TestFailoverBench measures how long the push's exactly-once services take
// to process again after kill -9 of one instance under load, on default
// settings, once with the killed instance restarted at once (as a restart
// policy does) and once left dead: a real-time job is published every
// 200 ms and its latency (publish to COMPLETED) is watched around the
// kill. Every job must complete exactly once and no target may get a job
// twice. Run by scripts/bench-failover.sh (SURGE_BENCH_OUT); skipped
// otherwise.
func TestFailoverBench(t *testing.T) {
	out := os.Getenv("SURGE_BENCH_OUT")
	if out == "" {
		t.Skip("a benchmark: scripts/bench-failover.sh runs it")
	}
	b := streamstest.RealBroker(t)
	var lines []string
	only := os.Getenv("SURGE_FAILOVER_CASES") // e.g. "planner/left dead"; empty: all
	for _, c := range []struct {
		victim  string // "planner" (the active one) or "executor"
		restart bool
	}{{"planner", true}, {"planner", false}, {"executor", true}, {"executor", false}} {
		if name := c.victim + "/" + map[bool]string{true: "restarted", false: "left dead"}[c.restart]; only != "" && !strings.Contains(only, name) {
			continue
		}
		line := failoverCase(t, b, c.victim, c.restart)
		t.Log(line)
		lines = append(lines, line)
	}
	head := fmt.Sprintf("%-10s %-10s %6s %16s %18s %16s", "killed", "then", "jobs", "first done (s)", "worst latency (s)", "all back (s)")
	if err := os.WriteFile(out, []byte(head+"\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// failoverCase runs one kill and reports: jobs published; seconds from the
// kill to the first completion of a job published after it; the worst
// latency of a job published from 1 s before the kill on; seconds from the
// kill until every later job completes within 1 s again.
func failoverCase(t *testing.T, b streamstest.Backend, victim string, restart bool) string {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bed := newPushBed(t, ctx, b, "failover", "SURGE_LOG_LEVEL="+cmp.Or(os.Getenv("SURGE_FAILOVER_LOG"), "warn"))
	ns, cl := bed.ns, bed.cl
	bed.onlineFollowers(2000)
	bed.run("presence", "push-presence", "--processor.instance_id=pres")
	planners := map[string]*service{
		"pa": bed.run("planner-a", "push-planner", "--processor.instance_id=pa"),
		"pb": bed.run("planner-b", "push-planner", "--processor.instance_id=pb"),
	}
	ea := bed.run("executor-a", "push-executor", "--push.executor_name=ea")
	bed.run("executor-b", "push-executor", "--push.executor_name=eb")
	bed.ready(ctx, "ea", "eb")

	// Completions, as a reader of push.job-transitions sees them.
	var mu sync.Mutex
	published := map[string]time.Time{}
	completed := map[string]time.Time{}
	twice := 0
	watch, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		rd, err := b.Kafka.NewClient(kgo.ConsumeTopics(ns+schemas.TopicJobTransitions), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		if err != nil {
			return
		}
		defer rd.Close()
		for watch.Err() == nil {
			rd.PollFetches(watch).EachRecord(func(r *kgo.Record) {
				var tr pb.JobTransition
				if streams.Decode(r, &tr) != nil || tr.To != pb.JobState_COMPLETED {
					return
				}
				mu.Lock()
				if _, ok := completed[tr.JobId]; ok {
					twice++
				} else {
					completed[tr.JobId] = time.Now()
				}
				mu.Unlock()
			})
		}
	}()
	pub := func(i int) {
		id := fmt.Sprintf("j%04d", i)
		r, _ := streams.NewRecord(ns+schemas.TopicJobs, []byte(id), &pb.SendJob{JobId: id, AccountId: 1, Realtime: true,
			Source: pb.TargetSource_FOLLOWERS, ContentId: id, ContentCrc: uint32(i + 1)})
		mu.Lock()
		published[id] = time.Now()
		mu.Unlock()
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Error(err)
		}
	}
	// Warm up until a job completes, then load for 5 s, kill, load 25 s.
	i := 0
	waitFor(t, ctx, "a first job completed", func() bool {
		pub(i)
		i++
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return len(completed) > 0
	})
	load := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); i++ {
			pub(i)
			time.Sleep(200 * time.Millisecond)
		}
	}
	load(5 * time.Second)
	var killed *service
	if victim == "planner" {
		killed = activePlanner(t, ctx, b.Kafka, ns, planners)
	} else {
		killed = ea
	}
	killedAt := time.Now()
	t.Logf("%s killed at %s", killed.name, killedAt.Format("15:04:05.000"))
	killed.kill()
	if restart {
		killed.start()
	}
	load(25 * time.Second)
	waitFor(t, ctx, "every job completed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(completed) == len(published)
	})
	time.Sleep(time.Second) // a second completion would have arrived by now
	stopWatch()

	mu.Lock()
	defer mu.Unlock()
	if twice > 0 {
		t.Fatalf("%d jobs completed twice", twice)
	}
	firstDone, worst, allBack := time.Duration(-1), time.Duration(0), time.Duration(0)
	ids := make([]string, 0, len(published))
	for id := range published {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		p, c := published[id], completed[id]
		if p.Before(killedAt.Add(-time.Second)) {
			continue
		}
		worst = max(worst, c.Sub(p))
		if p.After(killedAt) && (firstDone < 0 || c.Sub(killedAt) < firstDone) {
			firstDone = c.Sub(killedAt)
		}
		if c.Sub(p) > time.Second {
			allBack = max(allBack, c.Sub(killedAt))
		}
	}
	if r := reportsOfAll(t, ns, b.Kafka); r > 0 {
		t.Fatalf("%d deliveries of one job to one user twice", r)
	}
	then := "left dead"
	if restart {
		then = "restarted"
	}
	return fmt.Sprintf("%-10s %-10s %6d %16.1f %18.1f %16.1f", victim, then, len(published), firstDone.Seconds(), worst.Seconds(), allBack.Seconds())
}

// reportsOfAll counts deliveries of a job to a user that had it already,
// over every job, in one pass over push.reports.
func reportsOfAll(t *testing.T, ns string, kc streams.Cluster) uint64 {
	t.Helper()
	reached := map[string]*roaring.Bitmap{}
	var twice uint64
	err := streams.ReadToEnd(context.Background(), kc, ns+schemas.TopicReports, func(r *kgo.Record) error {
		var rep pb.DeliveryReport
		if streams.Decode(r, &rep) != nil || (rep.Status != pb.DeliveryStatus_DELIVERED && rep.Status != pb.DeliveryStatus_DELIVERED_ON_LOGIN) {
			return nil
		}
		set, err := reportedUins(&rep)
		if err != nil {
			return err
		}
		if reached[rep.JobId] == nil {
			reached[rep.JobId] = roaring.New()
		}
		twice += reached[rep.JobId].AndCardinality(set)
		reached[rep.JobId].Or(set)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return twice
}
