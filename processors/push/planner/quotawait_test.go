package planner

import (
	"context"
	"sync"
	"testing"
	"time"

	"surge/processors/push/internal/quota"
	"surge/processors/timer"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// A job filtered before its window has released any quota waits for the
// release (WAITING_QUOTA) instead of completing with nobody reached: at
// the release the timer service wakes it, it is filtered again and sent.
// While it waits nothing is charged or reported; a job cancelled while
// waiting never sends; a restore rebuilds the same memory.
func TestJobWaitsForTheNextQuotaRelease(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 900, "x")
		// A seed whose first window releases at least 10 minutes into the day.
		day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.Local)
		var seed uint64
		for seed = 1; quota.Plan(day, seed)[0].Release.Before(day.Add(10 * time.Minute)); seed++ {
		}
		release := quota.Plan(day, seed)[0].Release
		var mu sync.Mutex
		now := day.Add(time.Minute)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		cfg := DefaultConfig()
		cfg.UnitSize, cfg.MaxBacklog, cfg.CheckpointEvery, cfg.QuotaSeed = 100, 100, 0, seed
		cfg.Now = clock
		p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		x := &fakeExecutor{}
		stop := e.run(p, x)
		timers := timer.New(timer.Config{Env: streams.Env{Kafka: e.kafka, Namespace: e.ns, Log: e.log, Now: clock},
			Dir: t.TempDir(), TransactionalID: e.ns + "timers", Targets: []string{e.ns + "push."}})
		tctx, stopTimers := context.WithCancel(e.ctx)
		timersDone := make(chan struct{})
		go func() { defer close(timersDone); _ = timers.Run(tctx) }()

		job := func(id string, crc uint32) {
			e.send(schemas.TopicJobs, id, &pb.SendJob{JobId: id, AccountId: 7, Source: pb.TargetSource_FOLLOWERS, ContentId: id, ContentCrc: crc})
		}
		job("w", 1)
		job("c", 2)
		e.wait(p, "w", pb.JobState_WAITING_QUOTA)
		e.wait(p, "c", pb.JobState_WAITING_QUOTA)
		e.send(schemas.TopicJobCommands, "c", &pb.JobCommand{JobId: "c", Op: pb.JobCommand_CANCEL, RequestedBy: "test"})
		e.wait(p, "c", pb.JobState_CANCELLED)
		time.Sleep(300 * time.Millisecond)
		if n, _ := x.received("w"); n != 0 {
			t.Fatalf("w sent %d units before any quota was released", n)
		}
		if q := p.Quota(1); q != 0 {
			t.Fatalf("uin 1 charged %d units while its job waited", q)
		}

		mu.Lock()
		now = release.Add(time.Second)
		mu.Unlock()
		e.wait(p, "w", pb.JobState_COMPLETED)
		if n, twice := x.received("w"); n != 9 || twice {
			t.Fatalf("w: %d units (twice: %v), want its 9 once", n, twice)
		}
		if q := p.Quota(1); q != 1 {
			t.Fatalf("uin 1: quota %d after w, want 1", q)
		}
		time.Sleep(500 * time.Millisecond) // c's timer, had it not been cancelled, fires now too
		if st := p.State("c"); st != pb.JobState_CANCELLED {
			t.Fatalf("c is %s after the release, want CANCELLED", st)
		}
		if n, _ := x.received("c"); n != 0 {
			t.Fatalf("cancelled c sent %d units", n)
		}
		if h := p.Describe("w"); h == "" {
			t.Fatal("no description of w")
		}
		stopTimers()
		<-timersDone
		stop()
		e.sameAfterRestore(p, cfg)
	})
}
