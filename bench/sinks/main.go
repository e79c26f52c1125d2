// Command sinks measures the ClickHouse side on chDB: rows per second
// through a sink's insert path (records decoded, rows rendered, one INSERT
// per batch), and the cost of one hourly reconciliation over 10M grants
// (and their 10M bookings and tokens).
//
//	CHDB_LIB_PATH=... go run ./bench/sinks -rows 2000000 -grants 10000000
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/sinks/recon"
	"surge/streams"
)

func main() {
	rows := flag.Int("rows", 2_000_000, "rows through the grants sink")
	batch := flag.Int("batch", 100_000, "rows per INSERT (the sink's batch)")
	tasks := flag.String("tasks", "1,2", "tasks per sink to measure, comma-separated: each task builds and inserts its own batches, at once (sink.tasks)")
	runs := flag.Int("runs", 3, "runs per sink; the median and the range are reported (background merges of earlier runs make them vary)")
	grants := flag.Int("grants", 10_000_000, "grants in the reconciled hour")
	cpuprofile := flag.String("cpuprofile", "", "CPU profile of the sink part")
	flag.Parse()
	dir, err := os.MkdirTemp("", "bench-sinks-")
	must(err)
	defer os.RemoveAll(dir)
	taskCounts, err := parseCounts(*tasks)
	must(err)
	st, err := clickhouse.OpenChDB(dir, clickhouse.ChDBConnections(slices.Max(taskCounts)))
	must(err)
	defer st.Close()
	ctx := context.Background()
	_, err = clickhouse.Migrate(ctx, st)
	must(err)
	fmt.Printf("chDB (embedded ClickHouse 26.x); %d cores, %s\n", runtime.NumCPU(), runtime.Version())

	// 1. Sink path: records -> RowBinary rows -> one INSERT per batch.
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		must(err)
		must(pprof.StartCPUProfile(f))
	}
	now := time.Now().UnixMilli()
	grant := func(i int) *pb.RewardGrant {
		return &pb.RewardGrant{OrderNo: fmt.Sprintf("u%d_rain_r%d_1_1", i%100000, i), ActId: fmt.Sprintf("u%d", i%100000), ActivityId: "spring-live",
			ParentActivityId: "spring", SceneId: "rain", AwardType: pb.AwardType_CASH, Stage: 1, Amount: int64(1 + i%100), AtMs: now}
	}
	proof := make([]byte, 8*32)
	token := func(g *pb.RewardGrant) *pb.Token {
		return &pb.Token{AppId: "app", ActId: g.ActId, ActivityId: g.ActivityId, SceneId: g.SceneId, Amount: g.Amount, OutTradeNo: g.OrderNo,
			OpenTime: now, RainId: "r", Status: pb.TokenStatus_PROCESSING, KeyId: "k1", Signature: make([]byte, 64), BatchIndex: 7, BatchProof: proof, Grant: g}
	}
	for _, c := range []struct {
		sink func() *clickhouse.Sink
		note string
		rec  func(i int) proto.Message
	}{
		{clickhouse.Grants, "folds into wallet_orders", func(i int) proto.Message { return grant(i) }},
		// A cash grant rides in its token (Token.grant): a whole token,
		// signature and proof included, as intake publishes it.
		{clickhouse.CashGrants, "the grant read out of its token; folds into wallet_orders", func(i int) proto.Message { return token(grant(i)) }},
		{clickhouse.Tokens, "the token's grant checked, not kept; folds into wallet_orders", func(i int) proto.Message { return token(grant(i)) }},
		{clickhouse.Ledger, "folds into wallet_orders", func(i int) proto.Message {
			g := grant(i)
			return &pb.LedgerEntry{OrderNo: g.OrderNo, ActId: g.ActId, Amount: g.Amount, Kind: pb.LedgerKind_GRANT, BookedAtMs: now + 5000,
				ActivityId: g.ActivityId, SceneId: g.SceneId, BalanceAfter: int64(i), GrantedAtMs: now}
		}},
		{clickhouse.UinUsage, "no view", func(i int) proto.Message {
			return &pb.UsageEvent{Uin: uint64(10000 + i), Kind: "login", Source: "auth", AtMs: now}
		}},
		{clickhouse.RecycleSteps, "no view", func(i int) proto.Message {
			return &pb.RecycleStep{Uin: uint64(10000 + i), TicketId: fmt.Sprintf("t-%d", i), Step: pb.RecycleStepKind(1 + i%5), Category: "inactive", AtMs: now}
		}},
	} {
		name := c.sink().Name
		recs := make([]*kgo.Record, *batch)
		for i := range recs {
			recs[i], err = streams.NewRecord(c.sink().Topic, []byte("k"), c.rec(i))
			must(err)
		}
		batches := *rows / *batch
		for _, n := range taskCounts {
			var rates []float64
			for range *runs {
				start := time.Now()
				errs := make(chan error, n)
				for t := range n {
					s := c.sink().Bind(st)
					mine := batches*(t+1)/n - batches*t/n // the task's share of the batches
					go func() { errs <- sinkRows(ctx, s, recs, mine) }()
				}
				for range n {
					must(<-errs)
				}
				rates = append(rates, float64(*rows)/time.Since(start).Seconds())
			}
			slices.Sort(rates)
			fmt.Printf("%s, %d task(s): %.0f rows/s median of %d runs of %d rows (%.0f-%.0f; batches of %d: decode, RowBinary, INSERT; %s)\n",
				name, n, rates[len(rates)/2], *runs, *rows, rates[0], rates[len(rates)-1], *batch, c.note)
		}
	}
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
	}

	// Deliveries: one report record per 65,536 targets expands to rows.
	dsink := clickhouse.Deliveries()
	dh := dsink.Bind(st).Handle()
	set := roaring.New()
	set.AddRange(0, 65536)
	b, _ := set.ToBytes()
	rep, _ := streams.NewRecord(schemas.TopicReports, []byte("j"), &pb.DeliveryReport{JobId: "bench", Status: pb.DeliveryStatus_DELIVERED, Uins: b})
	start := time.Now()
	n := 0
	for n < *rows {
		must(dh(ctx, rep, nil))
		n += 65536
		if n%(*batch) < 65536 {
			must(dsink.FlushForBench(ctx))
		}
	}
	must(dsink.FlushForBench(ctx))
	el := time.Since(start)
	fmt.Printf("sink-deliveries: %d rows in %v = %.0f rows/s (roaring batches expanded to a row per uin)\n", n, el.Round(time.Millisecond), float64(n)/el.Seconds())

	// 2. One hour of 10M grants, tokens and bookings, generated in place.
	hour := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h0 := hour.UnixMilli()
	t0 := time.Now()
	gen := func(sql string) {
		sql = strings.NewReplacer("{N}", fmt.Sprint(*grants), "{H0}", fmt.Sprint(h0)).Replace(sql)
		must(st.Exec(ctx, sql))
	}
	order := "concat('u', toString(number % 1000000), '_rain_h', toString(number), '_1_1')"
	user := "concat('u', toString(number % 1000000))"
	scene := "concat('scene', toString(number % 4))"
	gen("INSERT INTO grants SELECT " + order + ", " + user + ", 'spring-live', 'spring', " + scene + ", 'CASH', 1 + number % 100, {H0} + number % 3600000 FROM numbers({N})")
	gen("INSERT INTO tokens SELECT " + order + ", " + user + ", 'spring-live', " + scene + ", 1 + number % 100, 'PROCESSING', {H0} + number % 3600000 FROM numbers({N})")
	gen("INSERT INTO ledger SELECT " + order + ", " + user + ", 'GRANT', 1 + number % 100, 'spring-live', " + scene + ", 0, {H0} + number % 3600000 + 5000, {H0} + number % 3600000 FROM numbers({N})")
	fmt.Printf("generated %d grants, tokens and bookings in %v (through the wallet_orders views)\n", *grants, time.Since(t0).Round(time.Millisecond))
	r := recon.New(recon.Config{Store: st, Env: streams.Env{Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))}})
	hourly := func(when string) {
		start := time.Now()
		res, bad, err := r.Run(ctx, recon.Hour(hour, recon.AttemptH1))
		must(err)
		fmt.Printf("hourly reconciliation over %d grants, %s: %v (%d results, %d mismatches; all three checks, per activity/scene and per user)\n",
			*grants, when, time.Since(start).Round(time.Millisecond), len(res), bad)
	}
	parts := func() string {
		p, err := st.QueryStrings(ctx, "SELECT count(), sum(rows) FROM system.parts WHERE active AND table = 'wallet_orders'")
		must(err)
		return fmt.Sprintf("%s parts, %s rows", p[0][0], p[0][1])
	}
	fmt.Printf("wallet_orders as the inserts left it: %s\n", parts())
	hourly("right after the inserts")
	// At h+1 the background merges have had the hour to fold the rows;
	// here they are forced, and their cost reported apart.
	start = time.Now()
	must(st.Exec(ctx, "OPTIMIZE TABLE wallet_orders FINAL"))
	fmt.Printf("folding wallet_orders (background merges, spread over the hour as rows arrive): %v, now %s\n", time.Since(start).Round(time.Millisecond), parts())
	hourly("once folded")
}

// sinkRows runs batches batches of recs through the sink, as one task's
// commits would: every record through the handler, then one insert.
func sinkRows(ctx context.Context, s *clickhouse.Sink, recs []*kgo.Record, batches int) error {
	h := s.Handle()
	for range batches {
		for _, r := range recs {
			if err := h(ctx, r, nil); err != nil {
				return err
			}
		}
		if err := s.FlushForBench(ctx); err != nil {
			return err
		}
	}
	return nil
}

func parseCounts(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-tasks: %q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
