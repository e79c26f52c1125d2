package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
	"surge/tools/progress"
)

// cmdEmbedded runs the whole pipeline on in-process servers and, unless
// demo.users is 0, drives generated login traffic through it and checks
// that every record arrived where it should.
func cmdEmbedded(ctx context.Context, args []string) error {
	v, _, err := loadConfig("embedded", args, nil)
	if err != nil {
		return err
	}
	log := newLogger(v)
	bs, stopKafka, err := kafkaOrEmbedded(ctx, v, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	cl, err := bs.NewClient(kgo.ProducerLinger(5 * time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := streams.EnsureTopics(ctx, cl, replication(v), schemas.Topics...); err != nil {
		return err
	}
	store, err := openStore(ctx, v, log)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := serveMetrics(ctx, v, log); err != nil {
		return err
	}
	rdb, stopRedis, err := redisOrEmbedded(ctx, v, log)
	if err != nil {
		return err
	}
	defer stopRedis()
	mirror, err := openMirror(ctx, rdb, v.GetString("redis.prefix"), log)
	if err != nil {
		return err
	}

	var presenceIn, dlqIn atomic.Int64
	base, err := runnerOptions(v, log)
	if err != nil {
		return err
	}
	with := func(extra ...streams.Option) []streams.Option {
		return append(append([]streams.Option{}, base...), extra...)
	}
	opts := map[string][]streams.Option{
		"presence":          with(streams.OnCommit(func(in, _ int) { presenceIn.Add(int64(in)) })),
		"sink-dead-letters": with(streams.OnCommit(func(in, _ int) { dlqIn.Add(int64(in)) }), streams.MaxBatch(v.GetInt("sink.max_batch"))),
		"sink-presence":     with(streams.MaxBatch(v.GetInt("sink.max_batch"))),
	}
	runCtx, stopPipeline := context.WithCancel(ctx)
	defer stopPipeline()
	p, err := startPipeline(runCtx, log, bs, store, mirror, nil, v.GetInt("sink.tasks"), opts)
	if err != nil {
		return err
	}

	users := v.GetInt("demo.users")
	if users <= 0 {
		log.Info("serving; interrupt to stop", "brokers", bs.String())
		<-ctx.Done()
		stopPipeline()
		return p.wait()
	}

	start := time.Now()
	traffic := generateLogins(users, v.GetUint64("demo.seed"))
	total := int64(len(traffic.events) + len(traffic.bad))
	fmt.Fprintf(os.Stderr, "driving %d login events for %d users (%d malformed or out of range)\n", total, users, len(traffic.bad))
	go func() {
		for i, ev := range traffic.events {
			rec, _ := streams.NewRecord(schemas.TopicLogin, schemas.UinKey(uint32(ev.Uin)), ev)
			cl.Produce(ctx, rec, nil)
			if i == len(traffic.events)/2 {
				for _, b := range traffic.bad {
					cl.Produce(ctx, b, nil)
				}
			}
		}
		_ = cl.Flush(ctx)
	}()

	bar := progress.New("logins processed", total)
	for presenceIn.Load() < total {
		if ctx.Err() != nil {
			bar.Done()
			stopPipeline()
			_ = p.wait()
			return fmt.Errorf("interrupted with %d of %d processed", presenceIn.Load(), total)
		}
		bar.Set(presenceIn.Load())
		time.Sleep(100 * time.Millisecond)
	}
	bar.Set(presenceIn.Load())
	bar.Done()
	processed := time.Since(start)

	// Wait for the sinks to land every change and dead letter in ClickHouse.
	wantChanges, wantDead := int64(traffic.changes), int64(len(traffic.bad))
	var rows [][]string
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows, err = store.QueryStrings(ctx, "SELECT (SELECT count() FROM presence_changes FINAL), (SELECT count() FROM dead_letters FINAL)")
		if err != nil {
			return err
		}
		if rows[0][0] == fmt.Sprint(wantChanges) && rows[0][1] == fmt.Sprint(wantDead) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	online := p.presence.Online().GetCardinality()
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	redisErr := mirror.WaitSynced(wctx)
	wcancel()
	inRedis, cerr := mirror.Count(ctx)
	if redisErr == nil {
		redisErr = cerr
	}
	reasons, _ := store.QueryStrings(ctx, "SELECT reason, count() FROM dead_letters FINAL GROUP BY reason ORDER BY reason")
	stopPipeline()
	if err := p.wait(); err != nil {
		return err
	}

	fmt.Printf("\nsurge embedded: %d users, %d login events in %v (%.0f events/s end to end)\n",
		users, total, processed.Round(time.Millisecond), float64(total)/processed.Seconds())
	fmt.Printf("  online now (bitmap):            %d (expected %d)\n", online, traffic.online)
	fmt.Printf("  online in Redis (shared bitmap): %d (err %v)\n", inRedis, redisErr)
	fmt.Printf("  presence changes in ClickHouse: %s (expected %d)\n", rows[0][0], wantChanges)
	fmt.Printf("  dead letters in ClickHouse:     %s (expected %d)\n", rows[0][1], wantDead)
	for _, r := range reasons {
		fmt.Printf("    %s x %s\n", r[1], r[0])
	}
	if online != uint64(traffic.online) || inRedis != int64(online) || rows[0][0] != fmt.Sprint(wantChanges) || rows[0][1] != fmt.Sprint(wantDead) {
		return fmt.Errorf("embedded run did not reconcile: see the figures above")
	}
	fmt.Println("  reconciled: every event is accounted for")
	return nil
}

type loginTraffic struct {
	events  []*surgev1.LoginEvent
	bad     []*kgo.Record
	changes int // state changes the presence processor must emit
	online  int // users online at the end
}

// generateLogins makes a day of churn: every user logs in, 30% log out,
// a third of those come back, and some events repeat (no state change).
func generateLogins(users int, seed uint64) loginTraffic {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var t loginTraffic
	state := make(map[uint32]bool, users)
	now := time.Now().UnixMilli()
	emit := func(uin uint32, on bool) {
		t.events = append(t.events, &surgev1.LoginEvent{Uin: uint64(uin), Online: on, AtMs: now + int64(len(t.events))})
		if state[uin] != on {
			t.changes++
		}
		state[uin] = on
	}
	base := uint32(rng.IntN(1 << 30))
	for i := 0; i < users; i++ {
		emit(base+uint32(i)*7, true) // sparse uins, like a real population
	}
	for i := 0; i < users; i++ {
		switch r := rng.Float64(); {
		case r < 0.10:
			emit(base+uint32(i)*7, false)
			emit(base+uint32(i)*7, true)
		case r < 0.30:
			emit(base+uint32(i)*7, false)
		case r < 0.35:
			emit(base+uint32(i)*7, true) // a second device: no change
		}
	}
	for _, on := range state {
		if on {
			t.online++
		}
	}
	bad := func(value []byte, msg *surgev1.LoginEvent) *kgo.Record {
		r, _ := streams.NewRecord(schemas.TopicLogin, nil, msg)
		if value != nil {
			r.Value = value
		}
		return r
	}
	t.bad = []*kgo.Record{
		bad([]byte{0xde, 0xad}, &surgev1.LoginEvent{}),
		bad([]byte{0xff, 0x01, 0x02}, &surgev1.LoginEvent{}),
		bad(nil, &surgev1.LoginEvent{Uin: 1 << 32, Online: true}),
		bad(nil, &surgev1.LoginEvent{Uin: 1 << 40, Online: true}),
	}
	return t
}
