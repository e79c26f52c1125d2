package presence_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/presence"
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
		streamstest.CreateTopics(t, b.Kafka, 3, in, out, dlq)
		cl := streamstest.Client(t, b.Kafka)
		var recs []*kgo.Record
		for u := uint64(0); u < 1000; u++ {
			recs = append(recs, login(t, in, u, true))
		}
		for u := uint64(0); u < 1000; u += 2 {
			recs = append(recs, login(t, in, u, false), login(t, in, u, false)) // repeated logout: one change
		}
		recs = append(recs, login(t, in, 1<<32, true), login(t, in, schemas.MaxUin, true))
		streamstest.ProduceSync(t, cl, recs...)

		p := presence.New(presence.Config{Output: out})
		r, err := streams.New(streamstest.Unique("presence"), p.Handle(), streams.Kafka(b.Kafka),
			streams.Inputs(in), streams.WithGuarantee(streams.ExactlyOnce), streams.DeadLetterTopic(dlq),
			streams.OnBatchEnd(p.BatchEnd), streams.Metrics(metrics.NewRegistry()),
			streams.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		changes := streamstest.ReadN(t, b.Kafka, out, true, 1501, 30*time.Second, time.Second)
		dead := streamstest.ReadN(t, b.Kafka, dlq, true, 1, 10*time.Second, 0)
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

		rebuilt := presence.New(presence.Config{Env: streams.Env{Kafka: b.Kafka}, Output: out})
		n, err := rebuilt.Restore(context.Background())
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
	p := presence.New(presence.Config{Output: "out"})
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

// Scaled out: a partition handed back to an instance after another one
// wrote to it is rebuilt from push.presence before it is used. Instance A
// sees every user log in; B joins and takes some partitions, where every
// user logs out; B leaves and A gets them back; everybody logs in again.
// A must emit every one of those logins: with the state it had before B's
// logouts it would see "already online" and say nothing, leaving those
// users offline on push.presence for good. A login keyed by anything but
// its uin goes to the dead letters.
func TestPartitionHandedBackIsRebuilt(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns := streamstest.Unique("pr") + "."
		in, out, dlq := ns+schemas.TopicLogin, ns+schemas.TopicPresence, ns+schemas.TopicDeadLetter
		streamstest.CreateTopics(t, b.Kafka, 6, in, out, dlq)
		cl := streamstest.Client(t, b.Kafka)
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		const users = 300
		wave := func(online bool) {
			var recs []*kgo.Record
			for u := uint64(1); u <= users; u++ {
				recs = append(recs, login(t, in, u, online))
			}
			streamstest.ProduceSync(t, cl, recs...)
		}
		// latest reads push.presence and returns the users whose last record says online.
		latest := func(want int) (online map[uint64]bool, records int) {
			recs := streamstest.ReadN(t, b.Kafka, out, true, want, 60*time.Second, time.Second)
			online = map[uint64]bool{}
			for _, r := range recs {
				var ev surgev1.LoginEvent
				if err := streams.Decode(r, &ev); err != nil {
					t.Fatal(err)
				}
				online[ev.Uin] = ev.Online
			}
			return online, len(recs)
		}
		type instance struct {
			p    *presence.Processor
			stop context.CancelFunc
			done chan error
		}
		run := func(id string) *instance {
			p := presence.New(presence.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: ns}})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- p.Run(ctx, streams.Group(ns+"presence"), streams.InstanceID(id),
					streams.DeadLetterTopic(dlq), streams.Metrics(metrics.NewRegistry()), streams.Logger(quiet))
			}()
			return &instance{p, cancel, done}
		}

		a := run("a")
		defer func() { a.stop(); <-a.done }()
		wave(true)
		if _, n := latest(users); n != users {
			t.Fatalf("%d presence records after the logins, want %d", n, users)
		}

		bi := run("b")
		// Wait until B holds partitions: a login of a fresh user shows up
		// in B's bitmap.
		deadline := time.Now().Add(60 * time.Second)
		probe := uint64(users)
		for owned := false; !owned; {
			probe++
			streamstest.ProduceSync(t, cl, login(t, in, probe, true))
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && !owned; {
				owned = bi.p.IsOnline(uint32(probe))
				time.Sleep(50 * time.Millisecond)
			}
			if time.Now().After(deadline) {
				t.Fatal("instance B never took a partition")
			}
		}
		probes := int(probe - users)
		wave(false)
		if _, n := latest(2*users + probes); n != 2*users+probes {
			t.Fatalf("%d presence records after the logouts, want %d", n, 2*users+probes)
		}
		bi.stop()
		if err := <-bi.done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("instance B: %v", err)
		}

		wave(true)
		// A bad key: dead-lettered, not applied.
		bad, err := streams.NewRecord(in, []byte("not-a-uin"), &surgev1.LoginEvent{Uin: 1, Online: false})
		if err != nil {
			t.Fatal(err)
		}
		streamstest.ProduceSync(t, cl, bad)
		online, n := latest(3*users + probes)
		missing := 0
		for u := uint64(1); u <= users; u++ {
			if !online[u] {
				missing++
			}
		}
		if missing > 0 || n != 3*users+probes {
			t.Fatalf("after B left and everybody logged in again: %d users offline on push.presence, %d records (want 0 and %d)",
				missing, n, 3*users+probes)
		}
		if dead := streamstest.ReadN(t, b.Kafka, dlq, true, 1, 10*time.Second, 0); len(dead) != 1 {
			t.Fatalf("%d dead letters, want the mis-keyed login", len(dead))
		}
		if !a.p.IsOnline(1) {
			t.Fatal("instance A's bitmap lost the mis-keyed logout's user")
		}
	})
}
