package presence_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/presence"
	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

func login(t *testing.T, topic string, uin uint64, online bool) *kgo.Record {
	r, err := streams.NewRecord(topic, schemas.UinKey(uint32(uin)), &surgev1.LoginEvent{Uin: uin, Online: online})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The bitmap follows logins and logouts, only changes are emitted, and a
// fresh processor restored from the presence topic has the same bitmap.
func TestPresenceFollowsLoginsAndRestoresByReplay(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		in, out, dlq := streamstest.Unique("login"), streamstest.Unique("presence"), streamstest.Unique("dlq")
		streamstest.CreateTopics(t, b.Brokers, 3, in, out, dlq)
		cl := streamstest.Client(t, b.Brokers)
		var recs []*kgo.Record
		for u := uint64(0); u < 1000; u++ {
			recs = append(recs, login(t, in, u, true))
		}
		for u := uint64(0); u < 1000; u += 2 {
			recs = append(recs, login(t, in, u, false), login(t, in, u, false)) // repeated logout: one change
		}
		recs = append(recs, login(t, in, 1<<32, true), login(t, in, schemas.MaxUin, true))
		streamstest.ProduceSync(t, cl, recs...)

		p := presence.New(out)
		r, err := streams.New(streamstest.Unique("presence"), p.Handle(), streams.Brokers(b.Brokers...),
			streams.Inputs(in), streams.WithGuarantee(streams.ExactlyOnce), streams.DeadLetterTopic(dlq),
			streams.OnBatchEnd(p.BatchEnd), streams.Metrics(metrics.NewRegistry()),
			streams.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		changes := streamstest.ReadN(t, b.Brokers, out, true, 1501, 30*time.Second, time.Second)
		dead := streamstest.ReadN(t, b.Brokers, dlq, true, 1, 10*time.Second, 0)
		cancel()
		<-done

		if len(changes) != 1501 { // 1000 logins + 500 logouts + schemas.MaxUin
			t.Fatalf("%d changes, want 1501", len(changes))
		}
		if len(dead) != 1 {
			t.Fatalf("%d dead letters, want the out-of-range uin", len(dead))
		}
		online := p.Online()
		if online.GetCardinality() != 501 || !online.Contains(1) || online.Contains(2) || !online.Contains(schemas.MaxUin) {
			t.Fatalf("online bitmap: %d users", online.GetCardinality())
		}

		rebuilt := presence.New(out)
		n, err := rebuilt.Restore(context.Background(), b.Brokers, out)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1501 || !rebuilt.Online().Equals(online) {
			t.Fatalf("restored from %d records: %d online, want %d", n, rebuilt.Online().GetCardinality(), online.GetCardinality())
		}
	})
}

// A batch that aborts leaves the bitmap as it was.
func TestAbortedBatchLeavesStateUntouched(t *testing.T) {
	p := presence.New("out")
	var o streams.Output
	if err := p.Handle()(context.Background(), login(t, "in", 5, true), &o); err != nil {
		t.Fatal(err)
	}
	p.BatchEnd(false)
	if p.IsOnline(5) {
		t.Fatal("aborted change applied")
	}
	if err := p.Handle()(context.Background(), login(t, "in", 5, true), &o); err != nil || o.Len() != 2 {
		t.Fatalf("replayed batch must emit the change again: %v, %d", err, o.Len())
	}
	p.BatchEnd(true)
	if !p.IsOnline(5) {
		t.Fatal("committed change not applied")
	}
}
