// Command recycle runs the whole stock recycling pipeline on N synthetic
// accounts (processors/uin/synth: produce, sink into chDB, classify,
// recycle every candidate through each step into the pool) and reports
// time per phase and memory, then checks that every candidate was pooled
// once and no active account was touched.
//
//	go run ./bench/recycle -accounts 1000000 -redis 127.0.0.1:16379
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/sinks/clickhouse"
	"surge/streams/embedded"
	synth "surge/tools/uinsynth"
)

// benchDB is the Redis database the bench writes to.
const benchDB = 15

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	redisAddr := flag.String("redis", "", "Redis address; empty starts miniredis in process (slow)")
	n := flag.Int("accounts", 1_000_000, "synthetic accounts (uins 1..N)")
	controllers := flag.Int("controllers", 4, "recycle controller instances in process")
	seed := flag.Uint64("seed", 1, "random seed")
	verbose := flag.Bool("v", false, "log warnings to stderr")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run here")
	profilePhase := flag.String("profile-phase", "all", "what -cpuprofile covers: all, or recycle (phase 4 alone)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	kc, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	if *redisAddr == "" {
		r, err := embedded.StartRedis()
		must(err)
		defer r.Close()
		*redisAddr = r.Addr()
	}
	// The bench's millions of keys go to a database of their own, emptied
	// before and after, so they never slow down what else uses the server.
	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, PoolSize: 64, DB: benchDB})
	defer rdb.Close()
	must(rdb.FlushDB(context.Background()).Err())
	defer rdb.FlushDB(context.Background())
	st, err := clickhouse.OpenChDB("")
	must(err)
	defer st.Close()
	dir, err := os.MkdirTemp("", "rbench-")
	must(err)
	defer os.RemoveAll(dir)
	fmt.Printf("backend: %s, redis %s, chDB; %d cores, %s; %d accounts, %d controllers\n",
		backend, *redisAddr, runtime.NumCPU(), runtime.Version(), *n, *controllers)
	startProfile := func() {
		f, err := os.Create(*cpuProfile)
		must(err)
		must(pprof.StartCPUProfile(f))
	}
	var recycling func()
	switch {
	case *cpuProfile == "":
	case *profilePhase == "recycle":
		recycling = startProfile
		defer pprof.StopCPUProfile()
	default:
		startProfile()
		defer pprof.StopCPUProfile()
	}
	last := time.Now()
	res, err := synth.Run(context.Background(), kc, rdb, st, synth.Options{Accounts: *n, Controllers: *controllers, Seed: *seed,
		Dir: dir, Namespace: fmt.Sprintf("rbench%d.", time.Now().UnixNano()), Log: log, Recycling: recycling,
		Progress: func(phase string, done, total int64) {
			if time.Since(last) > 2*time.Second {
				fmt.Fprintf(os.Stderr, "   %s: %d of %d\n", phase, done, total)
				last = time.Now()
			}
		}})
	must(err)
	res.Write(os.Stdout)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("memory: peak RSS %s (the whole process: kfake's log, chDB, 4 Pebble stores), Go heap in use %d MiB\n", peakRSS(), ms.HeapInuse>>20)
	if !res.OK() {
		fmt.Println("FAILED")
		os.Exit(1)
	}
	fmt.Println("ok")
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

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "recycle bench:", err)
		os.Exit(1)
	}
}
