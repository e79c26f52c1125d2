// Command timer measures the timer service: arming N timers, restoring
// them (Pebble rebuilt from the compacted topic), and firing them (each in
// a transaction with its tombstone).
//
//	go run ./bench/timer -timers 1000000
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

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/timer"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/embedded"
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	n := flag.Int("timers", 1_000_000, "pending timers")
	delay := flag.Duration("delay", 90*time.Second, "timers are due this long after arming (longer than the restore)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of restore and fire here")
	flag.Parse()
	kc, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	ctx := context.Background()
	ns := fmt.Sprintf("tbench%d.", time.Now().UnixNano())
	cl, err := kc.NewClient(kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	must(err)
	defer cl.Close()
	tt, _ := schemas.TopicByName(schemas.TopicTimers)
	tt.Name = ns + tt.Name
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, tt, schemas.Topic{Name: ns + "fired", Partitions: 12, Retention: time.Hour}))
	fmt.Printf("backend: %s; %d cores, %s\n", backend, runtime.NumCPU(), runtime.Version())

	// Arm: all due -delay from now, so they are pending while the service restores.
	due := time.Now().Add(*delay)
	start := time.Now()
	for i := range *n {
		rec, err := timer.Schedule(fmt.Sprintf("t%d", i), due, ns+"fired", nil, &pb.LoginEvent{Uin: uint64(i)})
		must(err)
		rec.Topic = tt.Name
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { must(err) })
	}
	must(cl.Flush(ctx))
	fmt.Printf("armed %d timers in %v = %.0f/s\n", *n, time.Since(start).Round(time.Millisecond), float64(*n)/time.Since(start).Seconds())

	dir, err := os.MkdirTemp("", "tbench-")
	must(err)
	defer os.RemoveAll(dir)
	s := timer.New(timer.Config{Env: streams.Env{Kafka: kc, Log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Topic: tt.Name, Dir: dir + "/db", TransactionalID: ns + "timer"})
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	start = time.Now()
	go func() { done <- s.Run(sctx) }()
	for !s.Live() {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Printf("restored %d pending timers into Pebble in %v\n", s.Pending(), time.Since(start).Round(time.Millisecond))
	if time.Now().After(due) {
		fmt.Println("warning: the restore outlasted the due time; firing started during it")
	}
	for time.Now().Before(due) {
		time.Sleep(time.Millisecond)
	}
	start = time.Now()
	for s.Fired() < int64(*n) {
		time.Sleep(5 * time.Millisecond)
	}
	el := time.Since(start)
	fmt.Printf("fired %d timers in %v = %.0f timers/s (each: payload + tombstone in a transaction of up to 5000)\n", *n, el.Round(time.Millisecond), float64(*n)/el.Seconds())
	cancel()
	<-done
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
