// Command wallet measures the reward wallet: grant intake (validate,
// idempotency check, sign, produce), booking into the ledger, and balance
// reads while a backlog of unbooked tokens waits; then the HTTP API with
// authentication on and off. The protobuf batch runs' callers are another
// process (callers.go), so the wallet process's CPU per grant is its own.
//
//	go run ./bench/wallet -redis 127.0.0.1:16379                          # kfake
//	go run ./bench/wallet -redis 127.0.0.1:16379 -brokers 127.0.0.1:19092 # real broker
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/bench/internal/proccpu"
	"surge/processors/wallet/app"
	"surge/processors/wallet/config"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/embedded"
	"surge/streams/metrics"
)

// benchDB is the Redis database the bench writes to.
const benchDB = 14

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	redisAddr := flag.String("redis", "127.0.0.1:16379", "redis-server")
	grants := flag.Int("grants", 200_000, "grants to accept")
	users := flag.Int("users", 100_000, "users the grants spread over")
	workers := flag.Int("workers", 2048, "concurrent callers")
	backlog := flag.Int("backlog", 1_000_000, "unbooked tokens waiting while balances are read")
	reads := flag.Int("reads", 20_000, "balance reads")
	batchers := flag.Int("batchers", app.Batchers, "intake batches in flight (Batcher workers; `surge wallet` default wallet.batchers)")
	batch := flag.Int("batch", app.BatchSize, "grants per intake batch (concurrent calls coalesced; `surge wallet` default wallet.batch_size)")
	httpGrants := flag.Int("http", 100_000, "grants per run through the HTTP API, auth on and off (0 skips the API runs)")
	httpWorkers := flag.Int("http-workers", 256, "concurrent HTTP callers")
	httpBatch := flag.Int("http-batch", 100, "grants per POST /v1/grants/batch request")
	protoCallers := flag.Int("proto-callers", 80, "concurrent callers of the protobuf batch runs: enough to keep the two cores busy (40 left a tenth of them idle, at half the latency)")
	callerCPUs := flag.String("callers-cpus", "", "run the protobuf runs' callers on these cores (taskset -c list; scripts/bench-wallet.sh gives the wallet process a core of its own)")
	protoRepeat := flag.Int("proto-repeat", 3, "protobuf batch runs with auth off and on, in turn (their medians are printed)")
	httpSingle := flag.Bool("http-single", true, "also run one grant per request (POST /v1/grants)")
	httpJSON := flag.Bool("http-json", true, "run the JSON grant runs (false: the protobuf batches alone)")
	cpuprofile := flag.String("cpuprofile", "", "CPU profile of the intake phase (and of booking, with .booking added; of the HTTP grant runs, with .http added)")
	traceOut := flag.String("trace", "", "execution trace of the booking phase (go tool trace)")
	gcPercent := flag.Int("gc-percent", app.GCPercent, "Go GC target, as `surge wallet` sets it (wallet.gc_percent); GOGC in the environment wins, as there")
	watchFlag := flag.String("watch", "", "other processes whose CPU to report beside this one's, name=pid,... (scripts/bench-wallet.sh: the broker and redis-server)")
	callers := flag.Bool("callers", false, "internal: be the callers' process of a protobuf batch run (callers.go)")
	flag.Parse()
	if *callers {
		callersMain()
		return
	}

	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(*gcPercent)
	}
	watch, err := proccpu.Parse(*watchFlag)
	must(err)
	kc, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	ctx := context.Background()
	ns := fmt.Sprintf("wbench%d.", time.Now().UnixNano())
	var produced produceStats
	cl, err := kc.NewClient(kgo.ProducerLinger(2*time.Millisecond), kgo.MaxBufferedRecords(1<<20), kgo.WithHooks(&produced))
	must(err)
	defer cl.Close()
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, app.Topics(ns)...))
	topics := app.TopicNames(ns)
	// The run's topics go with it: a broker shared by many runs would
	// otherwise keep 72 partitions of each.
	defer func() { _, _ = kadm.NewClient(cl).DeleteTopics(context.Background(), topics...) }()
	// A database of its own, emptied before and after: the million backlog
	// tokens must not stay in the test Redis (the presence mirror's resync
	// scans the keyspace, and its test times out on millions of keys).
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: *workers, DB: benchDB})
	must(rdb.FlushDB(ctx).Err())
	defer func() { _ = rdb.FlushDB(context.Background()).Err(); rdb.Close() }()
	now := time.Now()
	tree := &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-time.Hour), End: now.Add(24 * time.Hour), Budget: 1 << 50}},
		Scenes:   []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000}}}}}
	src := config.Static(tree)
	keys, err := token.Generate("bench")
	must(err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The instance `surge wallet` runs (without the live total, which the
	// bench does not read), its parts driven one phase at a time.
	w, err := app.New(app.Options{Kafka: kc, Namespace: ns, Dir: must2(os.MkdirTemp("", "wbench-ledger-")), Source: src,
		Keys: keys, Redis: rdb, Producer: cl, BatchSize: *batch, BatchLinger: time.Millisecond, Batchers: *batchers, NoTotal: true,
		Log: log, Metrics: metrics.NewRegistry()})
	must(err)
	defer w.Close()
	in, batcher, led := w.Intake, w.Batcher, w.Ledger
	fmt.Printf("backend: %s, redis-server %s; %d cores, %s\n", backend, *redisAddr, runtime.NumCPU(), runtime.Version())
	// A new namespace has no budget and stock counters yet: start them
	// (from topics that are empty) before the first grant, as a service
	// does on its start.
	_, err = in.RebuildCounters(context.Background(), false, nil)
	must(err)

	// 1. Intake.
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		must(err)
		must(pprof.StartCPUProfile(f))
	}
	// The callers' requests are made before the clock starts: the figure
	// is the intake's, not the load generator's.
	reqs := make([]*pb.RewardGrant, *grants)
	for i := range reqs {
		act := fmt.Sprintf("u%d", i%*users)
		n := order.Number{ActID: act, SceneID: "rain", RainID: fmt.Sprintf("r%d", i), AwardType: pb.AwardType_CASH, Stage: 1}
		reqs[i] = &pb.RewardGrant{OrderNo: n.String(), ActId: act, ActivityId: "spring", SceneId: "rain", RainId: n.RainID,
			AwardType: pb.AwardType_CASH, Stage: 1, Amount: int64(1 + i%100), AppId: "bench"}
	}
	var next, amount atomic.Int64
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	others := proccpu.Start(watch)
	start := time.Now()
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(*grants) {
					return
				}
				g := reqs[i]
				if _, err := batcher.Grant(ctx, g); err != nil {
					must(err)
				}
				amount.Add(g.Amount)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	fmt.Printf("intake: %d grants in %v = %.0f grants/s with %d callers, batches of up to %d; process CPU %.2f cores = %.0f grants/s per core of this process\n",
		*grants, el.Round(time.Millisecond), float64(*grants)/el.Seconds(), *workers, *batch, cpu.Seconds()/el.Seconds(), float64(*grants)/cpu.Seconds())
	if r := others.Report(*grants, "grant"); r != "" {
		fmt.Printf("  other processes meanwhile: %s\n", r)
	} else {
		fmt.Println("  (redis-server and, on the real broker, the JVM take the other share of the machine)")
	}
	fmt.Printf("  %s\n", produced.String())

	// 2. Booking: the ledger drains the tokens at full speed (no limit).
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	cpu0 = cpuTime()
	start = time.Now()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile + ".booking")
		must(err)
		must(pprof.StartCPUProfile(f))
	}
	if *traceOut != "" {
		f, err := os.Create(*traceOut)
		must(err)
		must(trace.Start(f))
	}
	go func() { done <- led.Run(lctx, streams.MaxBatch(20000)) }()
	// The rate is timed from the first booking: before it the ledger
	// restores its store, joins the group and rebuilds its partitions.
	for led.Bookings.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	startup := time.Since(start)
	start, cpu0 = time.Now(), cpuTime()
	for led.Bookings.Load() < int64(*grants) {
		time.Sleep(5 * time.Millisecond)
	}
	el = time.Since(start)
	cpu = cpuTime() - cpu0
	if *cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if *traceOut != "" {
		trace.Stop()
	}
	fmt.Printf("booking: %d tokens booked in %v = %.0f bookings/s; process CPU %.2f cores = %.0f bookings/s per core (ledger start before the first booking: %v)\n",
		*grants, el.Round(time.Millisecond), float64(*grants)/el.Seconds(), cpu.Seconds()/el.Seconds(), float64(*grants)/cpu.Seconds(), startup.Round(time.Millisecond))

	// 3. Reads with a backlog: a million tokens in the users' Redis hashes
	// that the ledger has not booked (written to Redis only, as when
	// booking is far behind the grant peak).
	backlogUsers := *backlog / 10 // ten unbooked tokens per user
	if *reads < 1 || backlogUsers < 1 {
		fmt.Println("balance reads: skipped (-reads below 1 or -backlog below 10)")
		stop()
		<-done
		return
	}
	// Signed as intake signs: batches of token.BatchSize, each token of
	// another user.
	pipe := rdb.Pipeline()
	var signing []*pb.Token
	for i := range *backlog {
		act := fmt.Sprintf("b%d", i%backlogUsers)
		tok := &pb.Token{AppId: "bench", ActId: act, ActivityId: "spring-live", SceneId: "rain", Amount: 10,
			OutTradeNo: fmt.Sprintf("%s_rain_x%d_1_1", act, i), OpenTime: time.Now().UnixMilli(), RainId: fmt.Sprint(i), Status: pb.TokenStatus_PROCESSING}
		if signing = append(signing, tok); len(signing) == token.BatchSize || i == *backlog-1 {
			keys.SignBatch(signing)
			for _, t := range signing {
				b, _ := protoMarshal(t)
				pipe.HSet(ctx, ns+"wtok:"+t.ActId, t.OutTradeNo, b)
			}
			signing = signing[:0]
		}
		if i%10000 == 9999 {
			_, err := pipe.Exec(ctx)
			must(err)
		}
	}
	_, err = pipe.Exec(ctx)
	must(err)
	// Reads are answered by the partitions' owner once it has rebuilt
	// them: here every partition, as this ledger is the only instance.
	tokensTopic, _ := schemas.TopicByName(schemas.TopicTokens)
	for led.Serving() < int(tokensTopic.Partitions) {
		time.Sleep(time.Millisecond)
	}
	readPass := func(label string, readers int) {
		lat := make([]time.Duration, *reads)
		var ri atomic.Int64
		start := time.Now()
		for range readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := ri.Add(1) - 1
					if i >= int64(*reads) {
						return
					}
					t0 := time.Now()
					v, err := led.Balance(ctx, fmt.Sprintf("b%d", i%int64(backlogUsers)))
					lat[i] = time.Since(t0)
					must(err)
					if v.Unbooked != 10 || v.Balance != 100 {
						must(fmt.Errorf("balance %+v", v))
					}
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
		fmt.Printf("balance reads, %s, %d readers, %d unbooked tokens waiting (%d users x 10): %d reads in %v = %.0f/s, p50 %v, p99 %v, max %v\n",
			label, readers, *backlog, backlogUsers, *reads, el.Round(time.Millisecond), float64(*reads)/el.Seconds(), lat[len(lat)/2].Round(time.Microsecond),
			lat[len(lat)*99/100].Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond))
	}
	readPass("first read of each user (10 tokens checked: leaf hashes, each batch root verified once per reader)", 2)
	readPass("read again (signatures cached)", 2)
	readPass("read again (signatures cached)", 8)
	fmt.Println("  (each read: the booked account from Pebble, the user's tokens from Redis, their signatures checked)")

	// 4. Through the HTTP API as deployed, authentication on and off.
	if *httpGrants > 0 {
		h := httpBench{ns: ns, in: in, batcher: batcher, led: led, cl: cl, rdb: rdb, src: src, log: log, workers: *httpWorkers, users: *users, watch: watch, callerCPUs: *callerCPUs}
		h.start()
		for _, readers := range []int{2, 8} {
			for _, on := range []bool{false, true} {
				h.reads(on, readers, *reads, backlogUsers)
			}
		}
		stop() // the ledger's booking would take CPU from the intake runs
		<-done
		if *cpuprofile != "" {
			f, err := os.Create(*cpuprofile + ".http")
			must(err)
			must(pprof.StartCPUProfile(f))
		}
		sizes := []int{*httpBatch}
		if *httpSingle {
			sizes = []int{1, *httpBatch}
		}
		if !*httpJSON {
			sizes = nil
		}
		for _, size := range sizes {
			for _, on := range []bool{false, true} {
				h.grants(on, size, *httpGrants)
			}
		}
		// The protobuf runs are the headline: repeated, off and on in
		// turn, and summed up by their medians (a run moves by 10% from one
		// to the next on this machine).
		var rates [2][]float64
		var cpus [2][]time.Duration
		for range *protoRepeat {
			for i, on := range []bool{false, true} {
				r, c := h.grantsProto(on, *httpBatch, *httpGrants, *protoCallers)
				rates[i], cpus[i] = append(rates[i], r), append(cpus[i], c)
			}
		}
		fmt.Printf("protobuf batches, median of %d runs each: auth off %.0f grants/s (wallet process %.2fµs/grant), auth on %.0f grants/s (%.2fµs/grant)\n",
			*protoRepeat, median(rates[0]), us(median(cpus[0])), median(rates[1]), us(median(cpus[1])))
		fmt.Printf("  derived: at %.2fµs of CPU a grant, the wallet process on 2 cores of its own (broker, Redis and callers elsewhere) would accept about %.0f grants/s with auth on\n",
			us(median(cpus[1])), 2e6/us(median(cpus[1])))
		if *cpuprofile != "" {
			pprof.StopCPUProfile()
		}
		h.close()
		return
	}
	stop()
	<-done
	_ = amount.Load()
}

// produceStats counts what intake's producer sent: the broker's cost is
// per request and per partition batch more than per record.
type produceStats struct{ requests, batches, records, bytes atomic.Int64 }

func (s *produceStats) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // Produce
		s.requests.Add(1)
	}
}

func (s *produceStats) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	s.batches.Add(1)
	s.records.Add(int64(m.NumRecords))
	s.bytes.Add(int64(m.CompressedBytes))
}

func (s *produceStats) String() string {
	req, b, r := max(s.requests.Load(), 1), max(s.batches.Load(), 1), s.records.Load()
	return fmt.Sprintf("producer: %d records in %d produce requests, %.1f partition batches per request, %.1f records per batch, %.0f bytes per record on the wire",
		r, req, float64(b)/float64(req), float64(r)/float64(b), float64(s.bytes.Load())/float64(max(r, 1)))
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func protoMarshal(m *pb.Token) ([]byte, error) { return proto.Marshal(m) }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func must2(s string, err error) string { must(err); return s }

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
