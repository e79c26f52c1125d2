// Command rebuild measures how long the wallet takes to rebuild its
// budget and stock counters and its order claims from the topics after
// Redis lost them (grant.Intake.RebuildCounters): N grants published as
// the intake publishes them (cash inside its token on wallet.tokens, a
// tenth coupons on wallet.grants), then the rebuild, timed; the counters
// are checked against what was published.
//
//	go run ./bench/rebuild -grants 10000000 -brokers 127.0.0.1:19092 -redis 127.0.0.1:16379
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/bench/internal/backend"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	redisAddr := flag.String("redis", "", "redis-server; empty starts miniredis in process")
	n := flag.Int("grants", 1_000_000, "grants published before the rebuild")
	flag.Parse()
	b, err := backend.Open(*brokersFlag, *redisAddr)
	must(err)
	defer b.Close()
	kc, rdb, cl := b.Kafka, b.Redis, b.Publisher
	ctx := context.Background()
	ns := fmt.Sprintf("rbench%d.", time.Now().UnixNano())
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, schemas.Namespaced(ns, schemas.TopicGrants, schemas.TopicTokens)...))

	now := time.Now()
	tree := &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-time.Hour), End: now.Add(time.Hour), Budget: 1 << 50}},
		Scenes: []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000},
			{ID: "coupon", Award: "coupon", MaxAmount: 1, Template: "t1", Stock: 1 << 40, Switches: config.Switches{StockControl: true}}}}}}
	start := time.Now()
	var cash, coupons int64
	for i := range *n {
		act := "u" + strconv.Itoa(i%1_000_000)
		var rec *kgo.Record
		if i%10 == 9 {
			o := order.Number{ActID: act, SceneID: "coupon", RainID: "c" + strconv.Itoa(i), AwardType: pb.AwardType_COUPON, Stage: 1}
			g := &pb.RewardGrant{OrderNo: o.String(), ActId: act, ActivityId: "spring-live", ParentActivityId: "spring", SceneId: "coupon",
				RainId: o.RainID, AwardType: pb.AwardType_COUPON, Stage: 1, Amount: 1, AppId: "app", TemplateId: "t1", AtMs: now.UnixMilli()}
			rec, err = streams.NewRecord(ns+schemas.TopicGrants, []byte(act), g)
			coupons++
		} else {
			o := order.Number{ActID: act, SceneID: "rain", RainID: "r" + strconv.Itoa(i), AwardType: pb.AwardType_CASH, Stage: 1}
			g := &pb.RewardGrant{OrderNo: o.String(), ActId: act, ActivityId: "spring-live", ParentActivityId: "spring", SceneId: "rain",
				RainId: o.RainID, AwardType: pb.AwardType_CASH, Stage: 1, Amount: 100, AppId: "app", AtMs: now.UnixMilli()}
			rec, err = streams.NewRecord(ns+schemas.TopicTokens, []byte(act), &pb.Token{AppId: "app", ActId: act, ActivityId: g.ActivityId,
				SceneId: "rain", Amount: 100, OutTradeNo: g.OrderNo, Grant: g})
			cash += 100
		}
		must(err)
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { must(err) })
	}
	must(cl.Flush(ctx))
	fmt.Printf("published %d grants in %v = %.0f/s\n", *n, time.Since(start).Round(time.Millisecond), float64(*n)/time.Since(start).Seconds())

	keys, err := token.Generate("k1")
	must(err)
	in := grant.New(grant.Config{Env: streams.Env{Kafka: kc, Namespace: ns, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics.NewRegistry()},
		Source: config.Static(tree), Keys: keys, Redis: rdb, RebuildSettle: time.Nanosecond})
	var ms runtime.MemStats
	start = time.Now()
	sum, err := in.RebuildCounters(ctx, true, nil)
	must(err)
	took := time.Since(start)
	runtime.ReadMemStats(&ms)
	spent, err := rdb.Get(ctx, ns+"wbudget:spring-live").Int64()
	must(err)
	fmt.Printf("rebuilt from %d records in %v = %.0f records/s (%d order claims set; Go heap in use after %d MB, total allocated %d MB)\n",
		sum.Records, took.Round(time.Millisecond), float64(sum.Records)/took.Seconds(), sum.OrderClaims, ms.HeapInuse>>20, ms.TotalAlloc>>20)
	if spent != cash+coupons {
		fmt.Fprintf(os.Stderr, "budget counter %d, published %d\n", spent, cash+coupons)
		os.Exit(1)
	}
	fmt.Printf("check: budget counter %d = published cash %d + coupons %d\n", spent, cash, coupons)
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
