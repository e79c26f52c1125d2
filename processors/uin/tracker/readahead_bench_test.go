package tracker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

// BenchmarkReadAhead is what the read-ahead (catchup.go) costs the
// tracker's throughput. One op: a stream of 50,000 registrations and
// 150,000 usage records, two thirds of it a stock account's (a uin the
// tracker does not track, which may start a catch-up), published in
// order, then consumed by one tracker from the group's start until its
// lag is 0. Run with the read-ahead (on) and without it (off); it reports
// records/s and the catch-ups and records read ahead per op. On the real
// broker (SURGE_TEST_KAFKA); scripts/bench-tracker.sh writes
// bench/tracker.txt.
func BenchmarkReadAhead(b *testing.B) {
	be := streamstest.RealBroker(b)
	for _, mode := range []struct {
		name string
		off  bool
	}{{"on", false}, {"off", true}} {
		b.Run(mode.name, func(b *testing.B) {
			var took time.Duration
			var records int
			var catchUps, readAhead float64
			for range b.N {
				d, n, c, r := trackOnce(b, be.Kafka, mode.off)
				took += d
				records += n
				catchUps += c
				readAhead += r
			}
			b.ReportMetric(float64(records)/took.Seconds(), "records/s")
			b.ReportMetric(catchUps/float64(b.N), "catchups/op")
			b.ReportMetric(readAhead/float64(b.N), "read-ahead/op")
		})
	}
}

// trackOnce publishes the stream into a new namespace and times one
// tracker consuming it to the end.
func trackOnce(b *testing.B, kc streams.Cluster, noReadAhead bool) (took time.Duration, records int, catchUps, readAhead float64) {
	b.StopTimer()
	defer b.StartTimer()
	ns := streamstest.Unique("ra") + "."
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := streamstest.Client(b, kc)
	topics := schemas.Namespaced(ns, schemas.TopicRegistrations, schemas.TopicUsage, schemas.TopicChecks, schemas.TopicTracking,
		schemas.TopicRecycleSteps, schemas.TopicRecycleReqs, schemas.TopicTimers, schemas.TopicDeadLetter)
	if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, topics...); err != nil {
		b.Fatal(err)
	}
	const registrations, stock = 50_000, 100_000
	now := time.Now()
	var recs []*kgo.Record
	for i := range registrations {
		at := now.Add(time.Duration(i) * 10 * time.Microsecond)
		uin, old := uint32(1_000_001+i), uint32(5_000_001+i%stock)
		reg := record(b, ns+schemas.TopicRegistrations, uin, &pb.UinRegistration{Uin: uint64(uin), AtMs: at.UnixMilli(), Completed: true}, at)
		own := record(b, ns+schemas.TopicUsage, uin, &pb.UsageEvent{Uin: uint64(uin), Kind: "login", AtMs: at.UnixMilli(), Source: "auth"}, at)
		recs = append(recs, reg, own)
		for k := range 2 {
			other := old + uint32(k*stock/2)
			recs = append(recs, record(b, ns+schemas.TopicUsage, other, &pb.UsageEvent{Uin: uint64(other), Kind: "message", AtMs: at.UnixMilli(), Source: "im"}, at))
		}
	}
	streamstest.ProduceSync(b, cl, recs...)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t := New(Config{Env: streams.Env{Kafka: kc, Namespace: ns, Metrics: metrics.NewRegistry(), Log: quiet}, Dir: b.TempDir()})
	t.noReadAhead = noReadAhead
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.StartTimer()
	began := time.Now()
	go func() { done <- t.Run(runCtx, streams.Logger(quiet)) }()
	adm := kadm.NewClient(cl)
	for {
		lags, err := adm.Lag(ctx, ns+Spec.Group)
		if err == nil {
			if l, ok := lags[ns+Spec.Group]; ok && l.Error() == nil && len(l.Lag) > 0 && l.Lag.Total() == 0 {
				break
			}
		}
		if ctx.Err() != nil {
			b.Fatal("the tracker did not consume the stream in 5 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	took = time.Since(began)
	b.StopTimer()
	stop()
	if err := <-done; err != nil && ctx.Err() == nil && runCtx.Err() == nil {
		b.Fatal(err)
	}
	for _, topic := range []string{ns + schemas.TopicRegistrations, ns + schemas.TopicUsage} {
		catchUps += t.mCatchUps.With(topic).Value()
		readAhead += t.mReadAhead.With(topic).Value()
	}
	return took, len(recs), catchUps, readAhead
}

// record is m keyed by uin on topic, stamped at.
func record(b *testing.B, topic string, uin uint32, m proto.Message, at time.Time) *kgo.Record {
	r, err := streams.NewRecord(topic, schemas.UinKey(uin), m)
	if err != nil {
		b.Fatal(err)
	}
	r.Timestamp = at
	return r
}
