// Package uinsynth runs the stock recycling pipeline end to end on synthetic
// accounts: it writes a stock of N accounts (their core data in Redis,
// registrations and usage on the topics), sinks them into ClickHouse,
// classifies them, and recycles every candidate through each step into
// the pool, then checks that every candidate was pooled once and no
// active account was touched. The recycle bench and `surge uin demo` run
// it; ban and cool-down are zero, so every timer still goes through the
// timer service but fires at once.
package uinsynth

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/uin/app"
	"surge/processors/uin/classify"
	"surge/processors/uin/recycle"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
)

// Account classes, as shares of the stock.
const (
	NeverCompleted = 0.05 // -> abandoned
	NeverLoggedIn  = 0.03 // -> spam
	Inactive       = 0.12 // -> inactive; the rest are active
)

// Options configures a run.
type Options struct {
	Accounts    int
	Controllers int
	Seed        uint64
	Dir         string
	Namespace   string
	Log         *slog.Logger
	// Progress is told each phase's progress (done of total).
	Progress func(phase string, done, total int64)
	// Recycling, if set, is called as the recycle phase starts (the
	// bench profiles that phase alone).
	Recycling func()
}

// Result is what a run measured and found.
type Result struct {
	Setup, Produce, Sink, Classify, Recycle time.Duration
	Registrations, Usage                    int
	Report                                  classify.Report
	Steps                                   int64
	Pooled, WantPooled                      int64
	FirstStep                               time.Duration // into the recycle phase: the services' start and catch-up
	WrongSteps                              int           // active accounts touched, or a candidate without each step once
}

// Total is the pipeline's time (setup excluded).
func (r Result) Total() time.Duration { return r.Produce + r.Sink + r.Classify + r.Recycle }

// OK reports whether every candidate was pooled once and nothing else touched.
func (r Result) OK() bool {
	return r.Pooled == r.WantPooled && r.WrongSteps == 0 && int64(r.Report.Requested) == r.WantPooled
}

// Run runs the pipeline once.
func Run(ctx context.Context, kc streams.Cluster, rdb redis.UniversalClient, st clickhouse.Store, o Options) (Result, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Progress == nil {
		o.Progress = func(string, int64, int64) {}
	}
	ns := o.Namespace
	zero := map[string]time.Duration{recycling.Abandoned: 0, recycling.Spam: 0, recycling.Inactive: 0}
	s := app.New(kc, rdb, app.Options{Namespace: ns, Dir: o.Dir, Log: o.Log, NoTracker: true,
		Controllers: o.Controllers, Policy: recycle.Policy{Ban: zero, CoolDown: zero, TicketTTL: time.Hour}})
	if err := s.CreateTopics(ctx, streams.OneCopy); err != nil {
		return Result{}, err
	}
	if _, err := clickhouse.Migrate(ctx, st); err != nil {
		return Result{}, err
	}
	var res Result
	now := time.Now()
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	n := o.Accounts

	// Setup: classes and the accounts' core data in Redis (for backup).
	t := time.Now()
	class := make([]byte, n+1)
	pipe := rdb.Pipeline()
	for u := 1; u <= n; u++ {
		switch x := rng.Float64(); {
		case x < NeverCompleted:
			class[u] = 'c'
		case x < NeverCompleted+NeverLoggedIn:
			class[u] = 'n'
		case x < NeverCompleted+NeverLoggedIn+Inactive:
			class[u] = 'i'
			res.WantPooled++
		default:
			class[u] = 'a'
		}
		if class[u] == 'c' || class[u] == 'n' {
			res.WantPooled++
		}
		name := "user" + strconv.Itoa(u)
		k := uinkeys.Prefix(ns) + "acct:" + strconv.Itoa(u)
		pipe.HSet(ctx, k, "username", name, "p:nick", "n"+strconv.Itoa(u))
		pipe.SAdd(ctx, k+":friends", 1+rng.IntN(n), 1+rng.IntN(n), 1+rng.IntN(n))
		pipe.Set(ctx, uinkeys.Prefix(ns)+"uname:"+name, u, 0)
		if pipe.Len() >= 30000 {
			if _, err := pipe.Exec(ctx); err != nil {
				return res, err
			}
			o.Progress("setup", int64(u), int64(n))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return res, err
	}
	o.Progress("setup", int64(n), int64(n))
	res.Setup = time.Since(t)

	// 1. Produce registrations and usage.
	t = time.Now()
	cl, err := kc.NewClient(kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	var produceErr atomic.Value
	emit := func(topic string, uin int, m proto.Message) error {
		rec, err := streams.NewRecord(topic, schemas.UinKey(uint32(uin)), m)
		if err != nil {
			return err
		}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				produceErr.Store(err)
			}
		})
		return nil
	}
	day := 24 * time.Hour
	ago := func(lo, hi int) int64 { return now.Add(-time.Duration(lo+rng.IntN(hi-lo)) * day).UnixMilli() }
	for u := 1; u <= n; u++ {
		c := class[u]
		if err := emit(ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: uint64(u), Username: "user" + strconv.Itoa(u),
			Completed: c != 'c', AtMs: ago(200, 900), Channel: "app"}); err != nil {
			return res, err
		}
		res.Registrations++
		login := func(source string, at int64) error {
			res.Usage++
			return emit(ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: uint64(u), Kind: recycling.KindLogin, Source: source, AtMs: at})
		}
		switch c {
		case 'i':
			err = login("auth", ago(200, 700))
			if err == nil {
				err = login("device", ago(190, 600))
			}
		case 'a':
			if rng.IntN(3) == 0 { // auth stale, device recent: active all the same
				err = login("auth", ago(300, 700))
				if err == nil {
					err = login("device", ago(1, 100))
				}
			} else {
				err = login("auth", ago(0, 170))
			}
		}
		if err != nil {
			return res, err
		}
		if u%50000 == 0 {
			o.Progress("produce", int64(u), int64(n))
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return res, err
	}
	if e, _ := produceErr.Load().(error); e != nil {
		return res, e
	}
	o.Progress("produce", int64(n), int64(n))
	res.Produce = time.Since(t)

	// 2. Sink into ClickHouse.
	t = time.Now()
	sctx, stopSinks := context.WithCancel(ctx)
	sinkErrs := make(chan error, 2)
	for _, sk := range []*clickhouse.Sink{clickhouse.UinRegistrations(), clickhouse.UinUsage()} {
		sk.Topic = ns + sk.Topic
		sk.Bind(st)
		go func() {
			sinkErrs <- sk.Run(sctx, kc, streams.Group(ns+sk.Name), streams.Logger(o.Log), streams.MaxBatch(100_000),
				streams.DeadLetterTopic(ns+schemas.TopicDeadLetter))
		}()
	}
	rows := int64(res.Registrations + res.Usage)
	for {
		got, err := count(ctx, st, "uin_registrations")
		if err == nil {
			var u int64
			if u, err = count(ctx, st, "uin_usage"); err == nil {
				got += u
			}
		}
		if err != nil {
			stopSinks()
			return res, err
		}
		o.Progress("sink", min(got, rows), rows)
		if got >= rows {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopSinks()
	<-sinkErrs
	<-sinkErrs
	res.Sink = time.Since(t)

	// 3. Classify.
	t = time.Now()
	if res.Report, err = classify.Run(ctx, st, cl, classify.Options{Namespace: ns, Now: func() time.Time { return now }, Log: o.Log}); err != nil {
		return res, err
	}
	res.Classify = time.Since(t)

	// 4. Recycle until the last uin is released.
	if o.Recycling != nil {
		o.Recycling()
	}
	t = time.Now()
	var released, steps atomic.Int64
	perUin := make([]atomic.Int32, n+1)
	rc, err := kc.NewClient(kgo.ConsumeTopics(ns+schemas.TopicRecycleSteps),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return res, err
	}
	defer rc.Close()
	rctx, stopStack := context.WithCancel(ctx)
	s.Start(rctx)
	want := int64(res.Report.Requested)
	for released.Load() < want {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		f := rc.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			stopStack()
			return res, ctx.Err()
		}
		f.EachRecord(func(r *kgo.Record) {
			entries, err := recycling.Decode(r)
			if err != nil {
				return
			}
			for _, st := range entries {
				if st.Uin > uint64(n) {
					continue
				}
				if steps.Add(1) == 1 {
					res.FirstStep = time.Since(t)
				}
				perUin[st.Uin].Add(1)
				if st.Step == pb.RecycleStepKind_RELEASE {
					released.Add(1)
				}
			}
		})
		o.Progress("recycle", released.Load(), want)
	}
	res.Recycle = time.Since(t)
	res.Steps = steps.Load()
	stopStack()
	if err := s.Wait(); err != nil {
		return res, err
	}

	// Check.
	if res.Pooled, err = s.Pool.Size(ctx); err != nil {
		return res, err
	}
	for u := 1; u <= n; u++ {
		got := perUin[u].Load()
		if class[u] == 'a' && got != 0 || class[u] != 'a' && got != 6 {
			res.WrongSteps++
		}
	}
	return res, nil
}

func count(ctx context.Context, st clickhouse.Store, table string) (int64, error) {
	rows, err := st.QueryStrings(ctx, "SELECT count() FROM "+table)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(rows[0][0], 10, 64)
}

// Write prints a result as the bench and the demo show it.
func (r Result) Write(f *os.File) {
	fmt.Fprintf(f, "setup:       %8s  accounts' core data into Redis (not counted)\n", r.Setup.Round(time.Millisecond))
	fmt.Fprintf(f, "1. produce:  %8s  %d registrations + %d usage events (%.0f records/s)\n", r.Produce.Round(time.Millisecond),
		r.Registrations, r.Usage, float64(r.Registrations+r.Usage)/r.Produce.Seconds())
	fmt.Fprintf(f, "2. sink:     %8s  %d rows into ClickHouse (%.0f rows/s)\n", r.Sink.Round(time.Millisecond),
		r.Registrations+r.Usage, float64(r.Registrations+r.Usage)/r.Sink.Seconds())
	fmt.Fprintf(f, "3. classify: %8s  %d scanned, groups %v, %d online skipped, %d tickets requested\n", r.Classify.Round(time.Millisecond),
		r.Report.Scanned, r.Report.Groups, r.Report.Online, r.Report.Requested)
	fmt.Fprintf(f, "4. recycle:  %8s  %d tickets through 6 steps each (%.0f uins/s, %.0f steps/s; %.0f accounts/s); the first step after %s\n", r.Recycle.Round(time.Millisecond),
		r.Report.Requested, float64(r.Report.Requested)/r.Recycle.Seconds(), float64(r.Steps)/r.Recycle.Seconds(),
		float64(r.Report.Scanned)/r.Recycle.Seconds(), r.FirstStep.Round(time.Millisecond))
	fmt.Fprintf(f, "total:       %8s  (phases 1-4)\n", r.Total().Round(time.Millisecond))
	fmt.Fprintf(f, "check: pool holds %d, want %d; %d uins with wrong steps (an active account touched, or a step not exactly once)\n",
		r.Pooled, r.WantPooled, r.WrongSteps)
}
