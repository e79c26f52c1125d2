// Command rebuildpool measures how long the uin pool takes to come back
// from uin.pool after Redis lost it (pool.Central.Rebuild): N uins inserted
// as `surge uin gaps` journals them (a record per bucket per 10,000), a
// share of them allocated as the allocators journal them (a commit of
// 1,000 uins at a time, from random buckets), then the rebuild into Redis,
// timed; the rebuilt pool is checked against what was published.
//
//	go run ./bench/rebuildpool -uins 10000000 -allocated 2000000 -brokers 127.0.0.1:19092 -redis 127.0.0.1:16379
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
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/bench/internal/backend"
	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	redisAddr := flag.String("redis", "", "redis-server; empty starts miniredis in process")
	n := flag.Int("uins", 1_000_000, "uins inserted into the pool")
	allocated := flag.Int("allocated", 200_000, "of them, allocated")
	buckets := flag.Int("buckets", 1000, "central pool buckets")
	flag.Parse()
	b, err := backend.Open(*brokersFlag, *redisAddr)
	must(err)
	defer b.Close()
	kc, rdb, cl := b.Kafka, b.Redis, b.Publisher
	ctx := context.Background()
	ns := fmt.Sprintf("pbench%d.", time.Now().UnixNano())
	topic := ns + schemas.TopicPool
	must(streams.EnsureTopics(ctx, cl, streams.OneCopy, schemas.Namespaced(ns, schemas.TopicPool)...))

	began := time.Now()
	records := 0
	publish := func(op pb.PoolChange_Op, uins []uint32) {
		for _, c := range pool.Changes(op, "", uins, *buckets, time.Now()) {
			rec, err := streams.NewRecord(topic, pool.BucketKey(c.Bucket), c)
			must(err)
			cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { must(err) })
			records++
		}
	}
	const base = 100_000_000
	batch := make([]uint32, 0, 10_000)
	for u := range *n {
		if batch = append(batch, uint32(base+u)); len(batch) == cap(batch) {
			publish(pb.PoolChange_INSERT, batch)
			batch = batch[:0]
		}
	}
	publish(pb.PoolChange_INSERT, batch)
	// Allocated: a random share, 1,000 per commit.
	rng := rand.New(rand.NewPCG(1, 2))
	perm := rng.Perm(*n)[:*allocated]
	batch = make([]uint32, 0, 1000)
	for _, i := range perm {
		if batch = append(batch, uint32(base+i)); len(batch) == cap(batch) {
			publish(pb.PoolChange_ALLOCATE, batch)
			batch = batch[:0]
		}
	}
	publish(pb.PoolChange_ALLOCATE, batch)
	must(cl.Flush(ctx))
	took := time.Since(began)
	fmt.Printf("published %d uins inserted and %d allocated in %d records in %s = %.0f records/s\n",
		*n, *allocated, records, took.Round(time.Millisecond), float64(records)/took.Seconds())

	c := pool.NewCentral(rdb, uinkeys.Pool(ns), *buckets)
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	sum, err := c.Rebuild(ctx, kc, topic, pool.RebuildOptions{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(err)
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	fmt.Printf("rebuilt from %d records in %s = %.0f records/s, %.0f uins/s (used %d, pooled %d; Go heap in use after %d MB, total allocated %d MB)\n",
		sum.Records, sum.Took.Round(time.Millisecond), float64(sum.Records)/sum.Took.Seconds(), float64(*n)/sum.Took.Seconds(),
		sum.Used, sum.Pooled, after.HeapInuse>>20, (after.TotalAlloc-before.TotalAlloc)>>20)
	size, err := c.Size(ctx)
	must(err)
	probe := uint32(base + perm[0])
	used, err := c.InUse(ctx, probe)
	must(err)
	ok := size == int64(*n-*allocated) && sum.Used == uint64(*allocated) && used
	fmt.Printf("check: pool holds %d = inserted %d - allocated %d; allocated uin %d marked used: %v; ok=%v\n", size, *n, *allocated, probe, used, ok)
	// Leave the server as it was: the rebuilt pool is 8M uins of keys.
	keys := []string{uinkeys.Pool(ns) + "used", uinkeys.Pool(ns) + "held", uinkeys.Pool(ns) + "gen", uinkeys.Pool(ns) + "release-offsets"}
	for b := range *buckets {
		keys = append(keys, fmt.Sprintf("%sbucket:%d", uinkeys.Pool(ns), b))
	}
	must(rdb.Del(ctx, keys...).Err())
	if !ok {
		os.Exit(1)
	}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "rebuildpool:", err)
		os.Exit(1)
	}
}
