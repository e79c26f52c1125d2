package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/processors/wallet/ledger"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/embedded"
	"surge/streams/streamstest"
)

// BenchmarkRebuild measures how fast a ledger rebuilds its store from
// wallet.ledger on start: recovery time after a crash is this rate times
// the topic's length. 300k entries over 10k users (30 each, as a user who
// grabs many packets in a rain).
func BenchmarkRebuild(b *testing.B) {
	k, err := embedded.StartKafka()
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	be := streamstest.Backend{Name: "kfake", Kafka: streams.Seeds(k.Brokers()...)}
	ns := streamstest.Unique("wr") + "."
	topics(b, be, ns)
	const entries, users = 300_000, 10_000
	cl := streamstest.Client(b, be.Kafka, kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	balance := map[string]int64{}
	recs := make([]*kgo.Record, 0, entries)
	for i := range entries {
		act := fmt.Sprintf("u%d", i%users)
		balance[act] += int64(1 + i%7)
		r, err := streams.NewRecord(ns+schemas.TopicLedger, []byte(act), &pb.LedgerEntry{OrderNo: fmt.Sprintf("%s_rain_r%d_1_1", act, i), ActId: act,
			Amount: int64(1 + i%7), Kind: pb.LedgerKind_GRANT, BookedAtMs: 1796000000000 + int64(i), ActivityId: "spring-live", SceneId: "rain",
			BalanceAfter: balance[act], GrantedAtMs: 1796000000000})
		if err != nil {
			b.Fatal(err)
		}
		recs = append(recs, r)
	}
	streamstest.ProduceSync(b, cl, recs...)
	src := config.Static(tree(0))
	b.ResetTimer()
	for range b.N {
		l := ledger.New(ledger.Config{Env: streams.Env{Kafka: be.Kafka, Namespace: ns, Log: quiet}, Dir: b.TempDir(), Source: src})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx, streams.Logger(quiet)) }()
		for !l.Ready() {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		if v, err := l.Balance(ctx, "u7"); err == nil && v.Balance != balance["u7"] {
			b.Fatalf("u7 rebuilt to %d, want %d", v.Balance, balance["u7"])
		}
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(entries*b.N)/b.Elapsed().Seconds(), "entries/s")
}
