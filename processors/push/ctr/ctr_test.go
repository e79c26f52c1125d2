package ctr_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/ctr"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func start(t *testing.T, ns string, b streamstest.Backend) (*ctr.Processor, func()) {
	p := ctr.New(ctr.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: ns, Log: quiet}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, streams.InstanceID(streamstest.Unique("ctr"))) }()
	return p, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func waitClicks(t *testing.T, p *ctr.Processor, job string, clicks, targets uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, ok := p.Job(job)
		if ok && j.Clicks == clicks && j.Targets == targets {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: %v, want %d clicks of %d targets", job, j, clicks, targets)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Clicks are counted once per job against its targets, across a restart
// (the new instance restores the counts from push.job-clicks and goes on
// from the committed offsets), capped at the targets; bad clicks are
// dead-lettered.
func TestClicksCountedOnceAcrossRestart(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns := streamstest.Unique("ctr") + "."
		cl := streamstest.Client(t, b.Kafka)
		ctx := context.Background()
		var topics []schemas.Topic
		for _, n := range []string{schemas.TopicClicks, schemas.TopicJobTransitions, schemas.TopicJobClicks, schemas.TopicDeadLetter} {
			tp, _ := schemas.TopicByName(n)
			tp.Name = ns + n
			topics = append(topics, tp)
		}
		if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, topics...); err != nil {
			t.Fatal(err)
		}
		msg := func(topic, key string, m proto.Message) *kgo.Record {
			r, err := streams.NewRecord(ns+topic, []byte(key), m)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		click := func(job string, uin uint64) *kgo.Record {
			return msg(schemas.TopicClicks, job, &pb.ClickEvent{JobId: job, AccountId: 7, Uin: uin})
		}
		recs := []*kgo.Record{
			msg(schemas.TopicJobTransitions, "j1", &pb.JobTransition{JobId: "j1", To: pb.JobState_PACKAGE_READY, Job: &pb.SendJob{JobId: "j1", AccountId: 7}, Targets: 1000}),
			msg(schemas.TopicJobTransitions, "j2", &pb.JobTransition{JobId: "j2", To: pb.JobState_PACKAGE_READY, Job: &pb.SendJob{JobId: "j2", AccountId: 8}, Targets: 3}),
		}
		for u := uint64(1); u <= 100; u++ {
			recs = append(recs, click("j1", u))
		}
		for u := uint64(1); u <= 5; u++ {
			recs = append(recs, click("j2", u)) // 5 clicks of 3 targets: counted 3
		}
		recs = append(recs, click("", 1), msg(schemas.TopicClicks, "j1", &pb.ClickEvent{JobId: "j1", Uin: 1 << 33}),
			msg(schemas.TopicClicks, "other", &pb.ClickEvent{JobId: "j1", Uin: 5}),
			&kgo.Record{Topic: ns + schemas.TopicClicks, Key: []byte("j1"), Value: []byte("\xff junk")})
		streamstest.ProduceSync(t, cl, recs...)
		p, stop := start(t, ns, b)
		waitClicks(t, p, "j1", 100, 1000)
		waitClicks(t, p, "j2", 3, 3)
		stop()

		var more []*kgo.Record
		for u := uint64(101); u <= 150; u++ {
			more = append(more, click("j1", u))
		}
		more = append(more, msg(schemas.TopicJobTransitions, "j1", &pb.JobTransition{JobId: "j1", To: pb.JobState_COMPLETED, Targets: 1000, AtMs: 1234}))
		streamstest.ProduceSync(t, cl, more...)
		p, stop = start(t, ns, b)
		defer stop()
		waitClicks(t, p, "j1", 150, 1000)
		if j, _ := p.Job("j1"); j.CompletedAtMs != 1234 || j.AccountId != 7 {
			t.Fatalf("j1: %v", j)
		}
		// What the planner reads: the compacted changelog's newest record.
		last := map[string]*pb.JobClicks{}
		for _, r := range streamstest.ReadN(t, b.Kafka, ns+schemas.TopicJobClicks, true, 2, 30*time.Second, 2*time.Second) {
			var jc pb.JobClicks
			if err := streams.Decode(r, &jc); err != nil {
				t.Fatal(err)
			}
			last[jc.JobId] = &jc
		}
		if j := last["j1"]; j == nil || j.Clicks != 150 || j.CompletedAtMs != 1234 {
			t.Errorf("push.job-clicks j1: %v", j)
		}
		if dl := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicDeadLetter, false, 4, 30*time.Second, time.Second); len(dl) != 4 {
			t.Errorf("%d dead letters, want the 4 bad clicks", len(dl))
		}
	})
}
