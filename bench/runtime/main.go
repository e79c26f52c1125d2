// Command runtime measures consume-transform-produce throughput of the
// streams runtime against bare franz-go on the same broker: the ceiling is
// a franz-go group consumer that copies every record to an output topic and
// commits per poll (the same at-least-once work with no runtime around it).
//
//	go run ./bench/runtime -records 500000 -size 100           # kfake
//	go run ./bench/runtime -brokers 127.0.0.1:19092 ...        # real broker
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/streams"
	"surge/streams/embedded"
	"surge/streams/metrics"
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	records := flag.Int("records", 500000, "records per run")
	size := flag.Int("size", 100, "value bytes per record")
	partitions := flag.Int("partitions", 6, "partitions of input and output")
	flag.Parse()

	kc, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	ctx := context.Background()
	cl, err := kc.NewClient(kgo.ProducerLinger(2 * time.Millisecond))
	must(err)
	defer cl.Close()
	suffix := fmt.Sprint(time.Now().UnixNano())
	in := "bench-in-" + suffix
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, schemas.Topic{Name: in, Partitions: int32(*partitions), Retention: time.Hour}))
	value := make([]byte, *size)
	_, _ = rand.Read(value)
	t0 := time.Now()
	for i := 0; i < *records; i++ {
		cl.Produce(ctx, &kgo.Record{Topic: in, Key: []byte(fmt.Sprint(i)), Value: value}, func(_ *kgo.Record, err error) { must(err) })
	}
	must(cl.Flush(ctx))
	fmt.Printf("backend: %s; %d records of %d bytes in %d partitions (loaded in %v)\n\n",
		backend, *records, *size, *partitions, time.Since(t0).Round(time.Millisecond))

	newOut := func(name string) string {
		t := "bench-out-" + name + "-" + suffix
		must(streams.EnsureTopics(ctx, cl, streams.OneCopy, schemas.Topic{Name: t, Partitions: int32(*partitions), Retention: time.Hour}))
		return t
	}
	bytesPerRun := float64(*records * (*size))
	report := func(name string, d time.Duration, ceiling time.Duration) {
		rps := float64(*records) / d.Seconds()
		line := fmt.Sprintf("%-34s %10.0f records/s %8.1f MB/s  (%v)", name, rps, bytesPerRun/d.Seconds()/1e6, d.Round(time.Millisecond))
		if ceiling > 0 {
			line += fmt.Sprintf("  %.0f%% of bare franz-go", 100*ceiling.Seconds()/d.Seconds())
		}
		fmt.Println(line)
	}

	bare := runBare(kc, in, newOut("bare"), *records)
	report("bare franz-go (ceiling)", bare, 0)
	copyRec := func(out string) streams.Handler {
		return func(_ context.Context, r *kgo.Record, o *streams.Output) error {
			o.Emit(&kgo.Record{Topic: out, Key: r.Key, Value: r.Value})
			return nil
		}
	}
	alo := runRuntime(kc, in, *records, copyRec(newOut("alo")), streams.AtLeastOnce)
	report("streams runtime, at-least-once", alo, bare)
	eos := runRuntime(kc, in, *records, copyRec(newOut("eos")), streams.ExactlyOnce)
	report("streams runtime, exactly-once", eos, bare)
}

// runBare is the ceiling: poll, copy every record, flush, commit.
func runBare(kc streams.Cluster, in, out string, n int) time.Duration {
	ctx := context.Background()
	cl, err := kc.NewClient(kgo.ConsumerGroup("bare-"+out), kgo.ConsumeTopics(in),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.MaxBufferedRecords(20000))
	must(err)
	defer cl.Close()
	start := time.Now()
	done := 0
	for done < n {
		f := cl.PollRecords(ctx, 10000)
		f.EachRecord(func(r *kgo.Record) {
			cl.Produce(ctx, &kgo.Record{Topic: out, Key: r.Key, Value: r.Value}, func(_ *kgo.Record, err error) { must(err) })
		})
		must(cl.Flush(ctx))
		must(cl.CommitUncommittedOffsets(ctx))
		done += f.NumRecords()
	}
	return time.Since(start)
}

func runRuntime(kc streams.Cluster, in string, n int, h streams.Handler, g streams.Guarantee) time.Duration {
	var committed atomic.Int64
	finished := make(chan struct{})
	r, err := streams.New(fmt.Sprintf("bench-%s-%d", g, time.Now().UnixNano()), h, streams.Kafka(kc),
		streams.Inputs(in), streams.WithGuarantee(g), streams.Metrics(metrics.NewRegistry()),
		streams.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		streams.OnCommit(func(i, _ int) {
			if committed.Add(int64(i)) == int64(n) {
				close(finished)
			}
		}))
	must(err)
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	go func() { _ = r.Run(ctx) }()
	<-finished
	d := time.Since(start)
	cancel()
	return d
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
