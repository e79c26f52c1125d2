// Command push measures mass push end to end: one job of -users targets
// through the whole stack (planner: converge, filter, dispatch; executors:
// online/offline split, reports; offline queues into Pebble), from the job
// record to the job's COMPLETED transition and to the last offline message
// queued. The users' logins are loaded first (not timed).
//
//	go run ./bench/push -users 10000000                          # kfake
//	go run ./bench/push -users 10000000 -brokers 127.0.0.1:19092 # real broker
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
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/app"
	"surge/processors/push/directory"
	"surge/processors/push/filter"
	"surge/processors/push/planner"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/embedded"
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	users := flag.Int("users", 10_000_000, "targets of the job (uins 1..users)")
	onlineShare := flag.Float64("online", 0.8, "share of targets online")
	unit := flag.Uint64("unit", 1<<18, "uins per unit")
	executors := flag.Int("executors", 2, "executors")
	backlog := flag.Int("backlog", 4, "units an executor may hold")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the timed part")
	flag.Parse()

	kc, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "bench-push-")
	must(err)
	defer os.RemoveAll(dir)
	ns := fmt.Sprintf("bench%d.", time.Now().UnixNano())
	cfg := planner.DefaultConfig()
	cfg.UnitSize, cfg.MaxBacklog = *unit, *backlog
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := app.New(kc, app.Options{Namespace: ns, Dir: dir, Executors: *executors, Planner: cfg, Log: log})
	must(s.CreateTopics(ctx, streams.OneCopy))
	must(s.Publish(ctx, directory.AccountRecord(ns, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.All &^ filter.Relation))})))

	// Setup (not timed): every online user's presence, as the presence
	// processor would have published it.
	cl, err := kc.NewClient(kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	must(err)
	defer cl.Close()
	targets, online := roaring.New(), roaring.New()
	targets.AddRange(1, uint64(*users)+1)
	step := int(1 / (1 - *onlineShare))
	t0 := time.Now()
	for u := uint32(1); u <= uint32(*users); u++ {
		if step > 0 && int(u)%step == 0 {
			continue // offline
		}
		online.Add(u)
		rec, err := streams.NewRecord(ns+schemas.TopicPresence, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
		must(err)
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { must(err) })
	}
	must(cl.Flush(ctx))
	fmt.Printf("backend: %s; %d cores, %s\n", backend, runtime.NumCPU(), runtime.Version())
	fmt.Printf("setup: %d users online of %d targets, presence loaded in %v\n", online.GetCardinality(), *users, time.Since(t0).Round(time.Millisecond))

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	must(s.Start(ctx))
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
	defer wcancel()
	must(s.WaitReady(wctx, *executors))
	for _, x := range s.Executors {
		for x.OnlineCount() != online.GetCardinality() {
			time.Sleep(10 * time.Millisecond)
		}
	}
	ob := s.Executors[0].OnlineBytes()
	fmt.Printf("online bitmap: %d users in %.2f MiB = %.3f MiB per million online (dense uins 1..N)\n",
		online.GetCardinality(), float64(ob)/(1<<20), float64(ob)/(1<<20)/(float64(online.GetCardinality())/1e6))
	sparse := roaring.New()
	for i := range uint32(1_000_000) {
		sparse.Add(i * 4294) // a million uins spread over the whole 32-bit space
	}
	fmt.Printf("online bitmap, sparse: 1M uins spread over 2^32 = %.3f MiB per million\n", float64(sparse.GetSizeInBytes())/(1<<20))

	uri, err := s.Packages.Put(ctx, "bench-job", targets)
	must(err)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	job := &pb.SendJob{JobId: "bench-job", AccountId: 1, Source: pb.TargetSource_PACKAGE, PackageUri: uri,
		ContentId: "c", ContentCrc: 1, Realtime: true}
	rec, err := streams.NewRecord(ns+schemas.TopicJobs, []byte(job.JobId), job)
	must(err)
	must(cl.ProduceSync(ctx, rec).FirstErr())
	for s.Planner.State(job.JobId) != pb.JobState_COMPLETED {
		if err := s.Err(); err != nil {
			must(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	sent := time.Since(start)
	offline := uint64(*users) - online.GetCardinality()
	for {
		q, _ := s.Offline.Stats()
		if uint64(q) >= offline {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	queued := time.Since(start)
	var delivered int64
	for _, x := range s.Executors {
		_, d, _ := x.Stats()
		delivered += d
	}
	fmt.Printf("job of %d users, %d units of %d, %d executors (backlog %d):\n", *users, (uint64(*users)+*unit-1) / *unit, *unit, *executors, *backlog)
	fmt.Printf("  sent (job COMPLETED): %v = %.0f users/s (%d delivered online, %d handed to offline queues)\n",
		sent.Round(time.Millisecond), float64(*users)/sent.Seconds(), delivered, offline)
	fmt.Printf("  offline queues persisted in Pebble: %v = %.0f users/s end to end\n",
		queued.Round(time.Millisecond), float64(*users)/queued.Seconds())
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	fmt.Printf("  process heap in use: %.0f MiB\n", float64(after.HeapInuse)/(1<<20))
	cancel()
	_ = s.Wait()
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
