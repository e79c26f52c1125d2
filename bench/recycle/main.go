// Command recycle runs the whole stock recycling pipeline on N synthetic
// accounts and reports time and memory per phase:
//
//  1. produce: registrations and usage events (logins by auth and by
//     device, messages) onto uin.registrations and uin.usage;
//  2. sink: the uin_registrations and uin_usage sinks load them into chDB;
//  3. classify: the stock classification picks the candidate groups and
//     requests a ticket for each;
//  4. recycle: the controllers take every ticket through ban, backup,
//     delete, cool-down and release (ban and cool-down set to zero: every
//     timer still goes through the timer service), until the last uin is
//     in the pool.
//
// It then checks the outcome: every candidate pooled once, no active
// account touched, every step applied once.
//
//	go run ./bench/recycle -accounts 1000000 -redis 127.0.0.1:16379
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/uin/classify"
	"surge/processors/uin/pipeline"
	"surge/processors/uin/recycle"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
	"surge/streams/embedded"
)

// Account classes, as shares of the stock.
const (
	neverCompleted = 0.05 // -> abandoned
	neverLoggedIn  = 0.03 // -> spam
	inactive       = 0.12 // -> inactive
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	redisAddr := flag.String("redis", "", "Redis address; empty starts miniredis in process (slow)")
	n := flag.Int("accounts", 1_000_000, "synthetic accounts (uins 1..N)")
	controllers := flag.Int("controllers", 4, "recycle controller instances in process")
	seed := flag.Uint64("seed", 1, "random seed")
	verbose := flag.Bool("v", false, "log warnings to stderr")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the recycle phase here")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	brokers, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	if *redisAddr == "" {
		r, err := embedded.StartRedis()
		must(err)
		defer r.Close()
		*redisAddr = r.Addr()
	}
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64})
	defer rdb.Close()
	st, err := clickhouse.OpenChDB("")
	must(err)
	defer st.Close()
	ctx := context.Background()
	_, err = clickhouse.Migrate(ctx, st)
	must(err)
	fmt.Printf("backend: %s, redis %s, chDB; %d cores, %s; %d accounts, %d controllers\n",
		backend, *redisAddr, runtime.NumCPU(), runtime.Version(), *n, *controllers)

	ns := fmt.Sprintf("rbench%d.", time.Now().UnixNano())
	zero := map[string]time.Duration{recycle.Abandoned: 0, recycle.Spam: 0, recycle.Inactive: 0}
	s := pipeline.New(brokers, rdb, pipeline.Options{Namespace: ns, Dir: mustTemp(), Log: log, NoTracker: true,
		Controllers: *controllers, Policy: recycle.Policy{Ban: zero, CoolDown: zero, TicketTTL: time.Hour}})
	must(s.CreateTopics(ctx, 1))

	// Setup (untimed): the accounts' core data in Redis, for backup.
	now := time.Now()
	rng := rand.New(rand.NewPCG(*seed, 7))
	class := make([]byte, *n+1)
	t0 := time.Now()
	pipe := rdb.Pipeline()
	for u := 1; u <= *n; u++ {
		switch x := rng.Float64(); {
		case x < neverCompleted:
			class[u] = 'c'
		case x < neverCompleted+neverLoggedIn:
			class[u] = 'n'
		case x < neverCompleted+neverLoggedIn+inactive:
			class[u] = 'i'
		default:
			class[u] = 'a'
		}
		k := ns + "acct:" + strconv.Itoa(u)
		pipe.HSet(ctx, k, "username", "user"+strconv.Itoa(u), "p:nick", "n"+strconv.Itoa(u))
		pipe.SAdd(ctx, k+":friends", 1+rng.IntN(*n), 1+rng.IntN(*n), 1+rng.IntN(*n))
		pipe.Set(ctx, ns+"uname:user"+strconv.Itoa(u), u, 0)
		if pipe.Len() >= 30000 {
			_, err := pipe.Exec(ctx)
			must(err)
		}
	}
	_, err = pipe.Exec(ctx)
	must(err)
	fmt.Printf("setup: %d accounts' data in Redis in %s (untimed)\n", *n, time.Since(t0).Round(time.Millisecond))

	total := time.Now()
	// 1. Produce.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	must(err)
	defer cl.Close()
	day := 24 * time.Hour
	ago := func(lo, hi int) int64 { return now.Add(-time.Duration(lo+rng.IntN(hi-lo)) * day).UnixMilli() }
	var regs, uses int
	emit := func(topic string, uin int, m proto.Message) {
		rec, err := streams.NewRecord(topic, recycle.Key(uint32(uin)), m)
		must(err)
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { must(err) })
	}
	want := map[byte]int{}
	t := time.Now()
	for u := 1; u <= *n; u++ {
		c := class[u]
		want[c]++
		emit(ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: uint64(u), Username: "user" + strconv.Itoa(u),
			Completed: c != 'c', AtMs: ago(200, 900), Channel: "app"})
		regs++
		login := func(source string, at int64) {
			emit(ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: uint64(u), Kind: recycle.KindLogin, Source: source, AtMs: at})
			uses++
		}
		switch c {
		case 'i':
			login("auth", ago(200, 700))
			login("device", ago(190, 600))
		case 'a':
			if rng.IntN(3) == 0 { // auth stale, device recent: active all the same
				login("auth", ago(300, 700))
				login("device", ago(1, 100))
			} else {
				login("auth", ago(0, 170))
			}
		}
	}
	must(cl.Flush(ctx))
	produced := time.Since(t)
	fmt.Printf("1. produce:  %8s  %d registrations + %d usage events (%.0f records/s)\n", produced.Round(time.Millisecond),
		regs, uses, float64(regs+uses)/produced.Seconds())

	// 2. Sink into chDB.
	t = time.Now()
	sctx, stopSinks := context.WithCancel(ctx)
	for _, sk := range []*clickhouse.Sink{clickhouse.UinRegistrations(), clickhouse.UinUsage()} {
		sk.Topic = ns + sk.Topic
		sk.Bind(st)
		go func() {
			_ = sk.Run(sctx, brokers, streams.Group(ns+sk.Name), streams.Logger(log), streams.MaxBatch(100_000),
				streams.DeadLetterTopic(ns+schemas.TopicDeadLetter))
		}()
	}
	waitCount(st, "uin_registrations", regs)
	waitCount(st, "uin_usage", uses)
	stopSinks()
	sunk := time.Since(t)
	fmt.Printf("2. sink:     %8s  %d rows into chDB (%.0f rows/s)\n", sunk.Round(time.Millisecond), regs+uses, float64(regs+uses)/sunk.Seconds())

	// 3. Classify.
	t = time.Now()
	rep, err := classify.Run(ctx, st, cl, classify.Options{Namespace: ns, Now: func() time.Time { return now }, Log: log})
	must(err)
	classified := time.Since(t)
	fmt.Printf("3. classify: %8s  %d scanned, groups %v, %d tickets requested\n", classified.Round(time.Millisecond),
		rep.Scanned, rep.Groups, rep.Requested)

	// 4. Recycle: start the controllers and the timer service, wait for the last release.
	t = time.Now()
	var released, stepsSeen, stopped atomic.Int64
	perUin := make([]atomic.Int32, *n+1)
	lastStep := make([]atomic.Int32, *n+1)
	done := make(chan struct{})
	go func() {
		rc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(ns+schemas.TopicRecycleSteps),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		must(err)
		defer rc.Close()
		for released.Load() < int64(rep.Requested) {
			f := rc.PollFetches(ctx)
			f.EachRecord(func(r *kgo.Record) {
				var st pb.RecycleStep
				must(streams.Decode(r, &st))
				stepsSeen.Add(1)
				perUin[st.Uin].Add(1)
				lastStep[st.Uin].Store(int32(st.Step))
				if st.Step == pb.RecycleStepKind_STOPPED && stopped.Add(1) <= 3 {
					fmt.Fprintf(os.Stderr, "   stopped: uin %d: %s\n", st.Uin, st.Reason)
				}
				if st.Step == pb.RecycleStepKind_RELEASE {
					released.Add(1)
				}
			})
		}
		close(done)
	}()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	rctx, stopStack := context.WithCancel(ctx)
	s.Start(rctx)
	tick := time.NewTicker(2 * time.Second)
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			hist := map[pb.RecycleStepKind]int{}
			for u := range lastStep {
				if k := pb.RecycleStepKind(lastStep[u].Load()); k != 0 && k != pb.RecycleStepKind_RELEASE {
					hist[k]++
				}
			}
			fmt.Fprintf(os.Stderr, "   recycle: %d of %d released, %d steps; in flight by step: %v\n", released.Load(), rep.Requested, stepsSeen.Load(), hist)
		}
	}
	tick.Stop()
	recycled := time.Since(t)
	fmt.Printf("4. recycle:  %8s  %d tickets through 6 steps each (%.0f uins/s, %.0f steps/s)\n", recycled.Round(time.Millisecond),
		rep.Requested, float64(rep.Requested)/recycled.Seconds(), float64(stepsSeen.Load())/recycled.Seconds())
	all := time.Since(total)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("total:       %8s  (phases 1-4); peak RSS %s, Go heap in use %d MiB\n", all.Round(time.Millisecond), peakRSS(), ms.HeapInuse>>20)
	stopStack()
	_ = s.Wait()

	// Check the outcome.
	size, err := s.Pool.Size(ctx)
	must(err)
	wantPooled := want['c'] + want['n'] + want['i']
	bad := 0
	for u := 1; u <= *n; u++ {
		steps := int(perUin[u].Load())
		switch {
		case class[u] == 'a' && steps != 0:
			bad++
		case class[u] != 'a' && steps != 6:
			bad++
		}
	}
	fmt.Printf("check: pool holds %d, want %d; %d uins with wrong steps (active touched, or a step not exactly once)\n", size, wantPooled, bad)
	if int(size) != wantPooled || bad != 0 || rep.Requested != wantPooled {
		fmt.Println("FAILED")
		os.Exit(1)
	}
	fmt.Println("ok")
}

func waitCount(st clickhouse.Store, table string, n int) {
	for {
		rows, err := st.QueryStrings(context.Background(), "SELECT count() FROM "+table)
		must(err)
		if c, _ := strconv.Atoi(rows[0][0]); c >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peakRSS reads the process's high-water resident set (Linux).
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.Atoi(strings.Fields(l)[1])
			return fmt.Sprintf("%d MiB", kb>>10)
		}
	}
	return "?"
}

func mustTemp() string {
	d, err := os.MkdirTemp("", "rbench-")
	must(err)
	return d
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "recycle bench:", err)
		os.Exit(1)
	}
}
