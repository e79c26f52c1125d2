package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/platform/apikey"
	"surge/processors/push/presence"
	"surge/processors/uin/allocation"
	uinapp "surge/processors/uin/app"
	"surge/processors/uin/classify"
	"surge/processors/uin/gaps"
	"surge/processors/uin/pool"
	"surge/processors/uin/recycle"
	"surge/processors/uin/restore"
	"surge/processors/uin/tracker"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
	"surge/tools/progress"
	synth "surge/tools/uinsynth"
)

const uinUsage = `surge uin ACTION: uin recycling
  run       the registration tracker, the recycle controller(s) and the timer service
            (kfake and miniredis unless --kafka.brokers / --redis.addr)
  classify  the stock classification: candidate groups from ClickHouse, a final online
            check (Redis online mirror when --redis.addr), a ticket request each
  restore   --username NAME: bring a recycled account back from its backup
  gaps      --ranges A-B,C-D: uins never allocated inside the allocated ranges (jump
            allocation's gaps), read from uin.registrations, into the pool
  demo      the stock pipeline end to end on --uin.accounts synthetic accounts, embedded
`

func cmdUin(ctx context.Context, args []string) error {
	var username, ranges string
	v, fs, err := loadConfig("uin", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&username, "username", "", "restore: the account to bring back")
		fs.StringVar(&ranges, "ranges", "", "gaps: allocated ranges, e.g. 10000-20000,50000-90000 (end exclusive)")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprint(os.Stderr, uinUsage)
		return fmt.Errorf("uin takes one action")
	}
	log := newLogger(v)
	switch fs.Arg(0) {
	case "run":
		return uinRun(ctx, v, log)
	case "classify":
		return uinClassify(ctx, v, log)
	case "restore":
		return uinRestore(ctx, v, username)
	case "gaps":
		return uinGaps(ctx, v, log, ranges)
	case "demo":
		return uinDemo(ctx, v, log)
	}
	fmt.Fprint(os.Stderr, uinUsage)
	return fmt.Errorf("uin: unknown action %q", fs.Arg(0))
}

// uinOptions reads the uin.* options.
func uinOptions(v *viper.Viper, log *slog.Logger) (uinapp.Options, error) {
	var cps []time.Duration
	for _, c := range strings.Split(v.GetString("uin.checkpoints"), ",") {
		d, err := time.ParseDuration(strings.TrimSpace(c))
		if err != nil || d <= 0 {
			return uinapp.Options{}, fmt.Errorf("uin.checkpoints: %q is not a positive duration", c)
		}
		if len(cps) > 0 && d <= cps[len(cps)-1] {
			return uinapp.Options{}, fmt.Errorf("uin.checkpoints: %s does not follow %s", d, cps[len(cps)-1])
		}
		cps = append(cps, d)
	}
	cats := []string{recycling.Abandoned, recycling.Spam, recycling.Inactive}
	pol := recycle.Policy{Ban: map[string]time.Duration{}, CoolDown: map[string]time.Duration{}, TicketTTL: v.GetDuration("uin.ticket_ttl"),
		EndedRetention: v.GetDuration("uin.ended_ticket_retention")}
	for _, c := range cats {
		pol.Ban[c], pol.CoolDown[c] = v.GetDuration("uin.ban."+c), v.GetDuration("uin.cool_down."+c)
	}
	return uinapp.Options{Namespace: v.GetString("uin.namespace"), Dir: v.GetString("uin.dir"), Policy: pol,
		Pool: allocation.Config{RebuildSettle: v.GetDuration("uin.rebuild_settle")},
		Tracker: tracker.Config{Checkpoints: cps, Rules: tracker.Rules{SpamReports: int64(v.GetInt("uin.spam_reports")),
			BurstMessages: int64(v.GetInt("uin.burst_messages"))}},
		Buckets: v.GetInt("uin.buckets"), Controllers: v.GetInt("uin.controllers"), Log: log, Metrics: metrics.Default}, nil
}

// stateDir is a service's local state directory: dir, made if missing,
// or a temporary one (removed by cleanup) when dir is empty or cannot be
// written (a container whose user may not create it and no volume is
// mounted on it). Local state is a cache of the topics, rebuilt at start,
// so the service runs either way; the warning says that the cache does
// not outlive the process then.
func stateDir(dir, pattern string, log *slog.Logger) (string, func(), error) {
	if dir != "" {
		err := os.MkdirAll(dir, 0o750)
		if err == nil {
			var f *os.File
			if f, err = os.CreateTemp(dir, ".writable-"); err == nil {
				f.Close()
				os.Remove(f.Name())
				return dir, func() {}, nil
			}
		}
		log.Warn("state directory not writable; using a temporary one (the local cache is rebuilt from the topics at every start)",
			"dir", dir, "err", err)
	}
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	return d, func() { os.RemoveAll(d) }, nil
}

// uinServices are the `surge run` names of the uin processors.
var uinServices = map[string]string{
	"uin-tracker": uinapp.Tracker,
	"uin-recycle": uinapp.Recycle,
	"uin-timers":  uinapp.Timers,
	"uin-pool":    uinapp.PoolAPI,
	"uin-restore": uinapp.Restore,
}

// poolConfig reads the uin-pool service's options.
func poolConfig(v *viper.Viper, log *slog.Logger) (allocation.Config, error) {
	keys, err := apiKeys(v, "uin.pool_keys", log)
	if err != nil {
		return allocation.Config{}, err
	}
	inst := v.GetString("processor.instance_id")
	if inst == "" {
		inst, _ = os.Hostname()
	}
	local := max(v.GetInt("uin.pool_local"), 1)
	gates, limits := httpLimits(v, "uin-pool")
	// A call that finds the local pool dry waits up to the refill wait;
	// the allocator excuses that wait (admission.Excuse), so the gate
	// steers by http.target_latency like the wallet's.
	return allocation.Config{Instance: inst, Addr: v.GetString("uin.pool_addr"), Keys: keys, Admission: gates, Limits: limits,
		LowWater: int64(v.GetInt("uin.pool_low_water")), RebuildSettle: v.GetDuration("uin.rebuild_settle"),
		Local: []pool.AllocatorOption{pool.LowWater(local), pool.Chunk(2 * local), pool.LeaseTTL(v.GetDuration("uin.pool_lease_ttl")), pool.RefillWait(v.GetDuration("uin.pool_refill_wait"))}}, nil
}

// apiKeys reads the callers' keys at name, or generates one and logs it
// (a development start; production configures them).
func apiKeys(v *viper.Viper, name string, log *slog.Logger) (*apikey.Keys, error) {
	if spec := v.GetString(name); spec != "" {
		k, err := apikey.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return k, nil
	}
	k, secret := apikey.Generate("dev")
	log.Warn("no "+name+" configured: generated one key for this process only; configure keys for production",
		"header", "Authorization: Bearer "+secret)
	return k, nil
}

// runUin runs one uin service until ctx ends or it fails.
func runUin(ctx context.Context, v *viper.Viper, log *slog.Logger, bs streams.Cluster, component string) error {
	o, err := uinOptions(v, log)
	if err != nil {
		return err
	}
	o.Components, o.Controllers = []string{component}, 1
	if component == uinapp.PoolAPI {
		if o.Pool, err = poolConfig(v, log); err != nil {
			return err
		}
	}
	var rdb redis.UniversalClient // the timers alone need none
	if component != uinapp.Timers || v.GetString("redis.addr") != "" {
		if rdb, err = needRedis(ctx, v, component+" (the accounts and the pool live there)"); err != nil {
			return err
		}
		defer rdb.Close()
	}
	dir, cleanup, err := stateDir(o.Dir, "surge-uin-", log)
	if err != nil {
		return err
	}
	defer cleanup()
	o.Dir = dir
	if o.StreamOpts, err = runnerOptions(v, log); err != nil {
		return err
	}
	s := uinapp.New(bs, rdb, o)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.Start(ctx)
	log.Info("uin service running", "service", component, "kafka", bs.String(), "redis", v.GetString("redis.addr"))
	return untilStopped(ctx, cancel, s.Group)
}

func uinRun(ctx context.Context, v *viper.Viper, log *slog.Logger) error {
	release, err := claimInstanceID(v, "uin-run", log)
	if err != nil {
		return err
	}
	defer release()
	o, err := uinOptions(v, log)
	if err != nil {
		return err
	}
	bs, rdb, stop, err := kafkaAndRedis(ctx, v, log)
	if err != nil {
		return err
	}
	defer stop()
	dir, cleanup, err := stateDir(o.Dir, "surge-uin-", log)
	if err != nil {
		return err
	}
	defer cleanup()
	o.Dir = dir
	if opts, err := runnerOptions(v, log); err == nil {
		o.StreamOpts = opts
	} else {
		return err
	}
	s := uinapp.New(bs, rdb, o)
	if err := s.CreateTopics(ctx, replication(v)); err != nil {
		return err
	}
	if err := serveMetrics(ctx, v, log); err != nil {
		return err
	}
	s.Start(ctx)
	log.Info("uin recycling running", "kafka", bs.String(), "redis", v.GetString("redis.addr"), "checkpoints", o.Tracker.Checkpoints, "controllers", o.Controllers)
	<-ctx.Done()
	return s.Wait()
}

func uinClassify(ctx context.Context, v *viper.Viper, log *slog.Logger) error {
	cl, err := newClient(ctx, v)
	if err != nil {
		return err
	}
	defer cl.Close()
	st, err := openStore(ctx, v, log)
	if err != nil {
		return err
	}
	defer st.Close()
	o := classify.Options{Namespace: v.GetString("uin.namespace"), MinAge: v.GetDuration("uin.min_age"),
		InactiveFor: v.GetDuration("uin.inactive_for"), Limit: v.GetInt("uin.limit"), Log: log}
	if v.GetString("redis.addr") != "" {
		rdb, err := needRedis(ctx, v, "uin classify")
		if err != nil {
			return err
		}
		defer rdb.Close()
		mirror := presence.NewRedisMirror(rdb, v.GetString("redis.prefix"), nil, log)
		o.Online = mirror.IsOnline
	} else {
		log.Warn("uin classify: no redis.addr, so no online check before tickets (the controller still checks logins)")
	}
	rep, err := classify.Run(ctx, st, cl, o)
	if err != nil {
		return err
	}
	fmt.Printf("scanned %d accounts older than %s; candidates by group %v; %d online, skipped; %d tickets requested in %s\n",
		rep.Scanned, o.MinAge, rep.Groups, rep.Online, rep.Requested, rep.Took.Round(time.Millisecond))
	return nil
}

func uinStores(ctx context.Context, v *viper.Viper) (redis.UniversalClient, *uinapp.Stack, error) {
	kc, err := needKafka(ctx, v)
	if err != nil {
		return nil, nil, err
	}
	rdb, err := needRedis(ctx, v, "this command (the accounts and the pool live there)")
	if err != nil {
		return nil, nil, err
	}
	s := uinapp.New(kc, rdb, uinapp.Options{Namespace: v.GetString("uin.namespace"), Buckets: v.GetInt("uin.buckets")})
	return rdb, s, nil
}

// uinRestore asks the uin-restore service to bring username back
// (uin.restore-requests) and prints its answer (uin.restore-results).
func uinRestore(ctx context.Context, v *viper.Viper, username string) error {
	if username == "" {
		return fmt.Errorf("restore needs --username")
	}
	bs, err := needKafka(ctx, v)
	if err != nil {
		return err
	}
	ns := v.GetString("uin.namespace")
	cl, err := bs.NewClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	// The answer comes after the request: read from the results' ends now.
	from, err := streams.EndOffsets(ctx, cl, ns+schemas.TopicRestoreResults)
	if err != nil {
		return fmt.Errorf("restore: %s: %w (surge topics --create)", ns+schemas.TopicRestoreResults, err)
	}
	id := fmt.Sprintf("cli-%d", time.Now().UnixNano())
	if err := cl.ProduceSync(ctx, restore.Request(ns, id, username, requestedBy("surge uin restore"), time.Now())).FirstErr(); err != nil {
		return fmt.Errorf("restore: publish request: %w", err)
	}
	fmt.Printf("restore of %q requested (%s); waiting for uin-restore's answer\n", username, id)
	wctx, cancel := context.WithTimeout(ctx, v.GetDuration("uin.restore_wait"))
	defer cancel()
	res, err := restore.AwaitResult(wctx, bs, ns, id, from)
	if err != nil {
		return fmt.Errorf("%w (is `surge run uin-restore` running?)", err)
	}
	switch {
	case res.Error != "":
		return fmt.Errorf("restore of %q refused: %s", username, res.Error)
	case res.Reused:
		fmt.Printf("restored %q on NEW uin %d (old uin %d belongs to another account now); %d friends found again\n",
			res.Username, res.Uin, res.OldUin, res.Friends)
	default:
		fmt.Printf("restored %q on its old uin %d; %d friends found again\n", res.Username, res.Uin, res.Friends)
	}
	return nil
}

// parseRanges reads "A-B,C-D" (end exclusive).
func parseRanges(s string) ([]gaps.Range, error) {
	var out []gaps.Range
	for _, part := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(part), "-")
		from, err1 := strconv.ParseUint(a, 10, 32)
		to, err2 := strconv.ParseUint(b, 10, 33)
		if !ok || err1 != nil || err2 != nil || from >= to || to > 1<<32 {
			return nil, fmt.Errorf("bad range %q: want FROM-TO with FROM < TO <= 4294967296", part)
		}
		out = append(out, gaps.Range{From: from, To: to})
	}
	return out, nil
}

func uinGaps(ctx context.Context, v *viper.Viper, log *slog.Logger, spec string) error {
	rs, err := parseRanges(spec)
	if err != nil {
		return err
	}
	rdb, s, err := uinStores(ctx, v)
	if err != nil {
		return err
	}
	defer rdb.Close()
	// The insertions go on uin.pool first: made here if no service has.
	if err := s.CreateTopics(ctx, replication(v)); err != nil {
		return err
	}
	if err := s.EnsurePool(ctx); err != nil {
		return err
	}
	allocated := roaring.New()
	n := 0
	err = streams.ReadToEnd(ctx, s.Kafka, s.Opts.Namespace+schemas.TopicRegistrations, func(r *kgo.Record) error {
		var g pb.UinRegistration
		if streams.Decode(r, &g) == nil && g.Uin > 0 && g.Uin <= 1<<32-1 {
			allocated.Add(uint32(g.Uin))
		}
		if n++; n%1_000_000 == 0 {
			log.Info("gaps: reading registrations", "read", n)
		}
		return nil
	})
	if err != nil {
		return err
	}
	found := gaps.Find(allocated, rs)
	fmt.Printf("%d registrations read; %d uins allocated; %d gaps in the ranges\n", n, allocated.GetCardinality(), found.GetCardinality())
	var inserted, refused int
	batch := make([]uint32, 0, 10000)
	flush := func() error {
		errs, err := s.Pool.Insert(ctx, batch)
		if err != nil {
			return err
		}
		for _, e := range errs {
			if e == nil {
				inserted++
			} else {
				refused++
			}
		}
		batch = batch[:0]
		return nil
	}
	it := found.Iterator()
	for it.HasNext() {
		if batch = append(batch, it.Next()); len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	fmt.Printf("pooled %d gaps; %d refused (in use, leased or pooled already)\n", inserted, refused)
	return nil
}

func uinDemo(ctx context.Context, v *viper.Viper, log *slog.Logger) error {
	bs, rdb, stop, err := kafkaAndRedis(ctx, v, log)
	if err != nil {
		return err
	}
	defer stop()
	st, err := openStore(ctx, v, log)
	if err != nil {
		return err
	}
	defer st.Close()
	dir, cleanup, err := stateDir(v.GetString("uin.dir"), "surge-uin-demo-", log)
	if err != nil {
		return err
	}
	defer cleanup()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var bar *progress.Bar
	phase := ""
	res, err := synth.Run(ctx, bs, rdb, st, synth.Options{Accounts: v.GetInt("uin.accounts"), Controllers: max(v.GetInt("uin.controllers"), 2),
		Seed: rand.Uint64(), Dir: dir, Namespace: v.GetString("uin.namespace") + fmt.Sprintf("demo%d.", time.Now().UnixNano()), Log: quiet,
		Progress: func(p string, done, total int64) {
			if p != phase {
				if bar != nil {
					bar.Done()
				}
				phase, bar = p, progress.New(p, total)
			}
			bar.Set(done)
		}})
	if bar != nil {
		bar.Done()
	}
	if err != nil {
		return err
	}
	res.Write(os.Stdout)
	if !res.OK() {
		return fmt.Errorf("uin demo: the recycling outcome is wrong (see the check line)")
	}
	fmt.Println("uin demo: every candidate recycled once into the pool; no active account touched")
	return nil
}
