package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/presence"
	"surge/processors/push/filter"
	"surge/processors/push/numpkg"
	push "surge/processors/push/pipeline"
	"surge/processors/push/planner"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// cmdLoadgen drives realistic mass-push traffic through the push stack:
// follower lists with a Zipf distribution over accounts (published on
// push.fan-delta too), logins and churn, and jobs of every source, size and
// priority, a few of them malformed. It ends with a summary and fails if a
// user got a job's message twice.
func cmdLoadgen(ctx context.Context, args []string) error {
	v, _, err := loadConfig("loadgen", args, nil)
	if err != nil {
		return err
	}
	log := newLogger(v)
	bs, stopKafka, err := brokersOrEmbedded(v, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	dir := v.GetString("push.dir")
	if dir == "" {
		if dir, err = os.MkdirTemp("", "surge-push-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	ns := v.GetString("push.namespace")
	cfg := planner.DefaultConfig()
	cfg.UnitSize, cfg.MaxBacklog, cfg.MinLead = uint64(v.GetInt("push.unit_size")), v.GetInt("push.max_backlog"), v.GetDuration("push.min_lead")
	stack := push.New(bs, push.Options{Namespace: ns, Dir: dir, Executors: v.GetInt("push.executors"), Planner: cfg,
		MirrorThreshold: uint64(v.GetInt("push.mirror_threshold")), Log: log, Metrics: metrics.Default})
	if err := stack.CreateTopics(ctx, int16(v.GetInt("kafka.replication"))); err != nil {
		return err
	}
	serveMetrics(ctx, v, log)
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20))
	if err != nil {
		return err
	}
	defer cl.Close()

	g := newTraffic(v)
	fmt.Fprintf(os.Stderr, "loadgen: %d users, %d accounts (Zipf s=%.2f), %d jobs, churn %d/s\n",
		g.users, g.accounts, g.zipfS, g.jobs, g.churn)
	if err := g.followers(ctx, cl, stack, ns); err != nil {
		return err
	}
	if err := g.logins(ctx, cl, ns); err != nil {
		return err
	}
	sctx, stopStack := context.WithCancel(ctx)
	defer stopStack()
	if err := stack.Start(sctx); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = stack.WaitReady(wctx, v.GetInt("push.executors"))
	cancel()
	if err != nil {
		return err
	}

	churnCtx, stopChurn := context.WithCancel(ctx)
	var churned atomic.Int64
	go g.churnLoop(churnCtx, cl, ns, &churned)
	jobs, err := g.submitJobs(ctx, cl, stack, ns)
	if err != nil {
		stopChurn()
		return err
	}
	waitErr := g.waitJobs(ctx, stack, jobs, v.GetDuration("loadgen.timeout"))
	stopChurn()
	settle(stack) // let the offline queues catch up with the last logins
	sumErr := g.summary(ctx, bs, ns, stack, jobs, churned.Load())
	stopStack()
	return errors.Join(waitErr, sumErr, stack.Wait())
}

// settle waits until the offline queues have not moved for a second.
func settle(s *push.Stack) {
	q, d := s.Offline.Stats()
	for still := 0; still < 10; {
		time.Sleep(100 * time.Millisecond)
		q2, d2 := s.Offline.Stats()
		if q2 == q && d2 == d {
			still++
		} else {
			still, q, d = 0, q2, d2
		}
	}
}

type traffic struct {
	users, accounts, jobs, churn int
	zipfS, online                float64
	rng                          *rand.Rand
	fans                         []*roaring.Bitmap // by account index (account id = index+1)
	onlineSet                    *roaring.Bitmap
}

func newTraffic(v *viper.Viper) *traffic {
	return &traffic{users: v.GetInt("loadgen.users"), accounts: v.GetInt("loadgen.accounts"), jobs: v.GetInt("loadgen.jobs"),
		churn: v.GetInt("loadgen.churn"), zipfS: v.GetFloat64("loadgen.zipf"), online: v.GetFloat64("loadgen.online"),
		rng: rand.New(rand.NewSource(int64(v.GetInt("loadgen.seed")))), onlineSet: roaring.New()}
}

func (g *traffic) uin() uint32 { return uint32(1 + g.rng.Intn(g.users)) }

// followers builds the follower lists: account of rank r has about
// users/2 / r^s followers (at least 10), registered in the source store
// and published as fan-list deltas.
func (g *traffic) followers(ctx context.Context, cl *kgo.Client, s *push.Stack, ns string) error {
	total := 0
	sizes := make([]int, g.accounts)
	for r := range g.accounts {
		sizes[r] = max(10, int(float64(g.users/2)/math.Pow(float64(r+1), g.zipfS)))
		total += sizes[r]
	}
	bar := newProgress("follows", int64(total))
	n := 0
	for r := range g.accounts {
		id := uint64(r + 1)
		s.Accounts.Put(planner.Account{ID: id, Filters: filter.All})
		s.Source.AddAccount(id)
		set := roaring.New()
		for set.GetCardinality() < uint64(sizes[r]) {
			set.Add(g.uin())
		}
		g.fans = append(g.fans, set)
		it := set.Iterator()
		for it.HasNext() {
			d := &pb.FanDelta{AccountId: id, Uin: uint64(it.Next()), Op: pb.FanDelta_FOLLOW, AtMs: time.Now().UnixMilli()}
			s.Source.Apply(d)
			rec, err := streams.NewRecord(ns+schemas.TopicFanDelta, []byte(fmt.Sprint(id)), d)
			if err != nil {
				return err
			}
			cl.Produce(ctx, rec, nil)
			if n++; n%50000 == 0 {
				bar.set(int64(n))
			}
		}
		// Tags for targeting: a third of each account's followers are "vip".
		s.Tags.Tag(fmt.Sprintf("vip-%d", id), sample(set, 3)...)
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	bar.set(int64(n))
	bar.done()
	return nil
}

func sample(set *roaring.Bitmap, every int) []uint32 {
	var out []uint32
	i := 0
	it := set.Iterator()
	for it.HasNext() {
		u := it.Next()
		if i%every == 0 {
			out = append(out, u)
		}
		i++
	}
	return out
}

func (g *traffic) login(ctx context.Context, cl *kgo.Client, ns string, uin uint32, on bool) {
	rec, _ := streams.NewRecord(ns+schemas.TopicLogin, presence.Key(uin), &pb.LoginEvent{Uin: uint64(uin), Online: on, AtMs: time.Now().UnixMilli()})
	cl.Produce(ctx, rec, nil)
}

func (g *traffic) logins(ctx context.Context, cl *kgo.Client, ns string) error {
	n := int(float64(g.users) * g.online)
	bar := newProgress("logins", int64(n))
	for i := 0; g.onlineSet.GetCardinality() < uint64(n); i++ {
		u := g.uin()
		if g.onlineSet.CheckedAdd(u) {
			g.login(ctx, cl, ns, u, true)
		}
		if i%50000 == 0 {
			bar.set(int64(g.onlineSet.GetCardinality()))
		}
	}
	err := cl.Flush(ctx)
	bar.set(int64(n))
	bar.done()
	return err
}

// churnLoop logs random users in and out at the configured rate.
func (g *traffic) churnLoop(ctx context.Context, cl *kgo.Client, ns string, n *atomic.Int64) {
	rng := rand.New(rand.NewSource(g.rng.Int63()))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	per := max(g.churn/100, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for range per {
			g.login(ctx, cl, ns, uint32(1+rng.Intn(g.users)), rng.Intn(2) == 0)
			n.Add(1)
		}
	}
}

type submitted struct {
	job  *pb.SendJob
	bad  bool
	size uint64
}

// submitJobs submits jobs: accounts by Zipf rank (big accounts send more),
// sources mixed (60% followers, 25% package, 15% tags), priorities 0..9,
// 5% real-time, 2% malformed.
func (g *traffic) submitJobs(ctx context.Context, cl *kgo.Client, s *push.Stack, ns string) ([]submitted, error) {
	zipf := rand.NewZipf(g.rng, max(g.zipfS, 1.01), 1, uint64(g.accounts-1))
	var out []submitted
	for i := range g.jobs {
		acc := zipf.Uint64() + 1
		j := &pb.SendJob{JobId: fmt.Sprintf("job-%05d", i), AccountId: acc, ContentId: fmt.Sprintf("content-%d", i),
			ContentCrc: uint32(i + 1), Priority: int32(g.rng.Intn(10)), Realtime: g.rng.Intn(20) == 0,
			CreatedAtMs: time.Now().UnixMilli()}
		sub := submitted{job: j}
		switch x := g.rng.Intn(100); {
		case x < 2: // malformed: unknown account or an empty package
			sub.bad = true
			if x == 0 {
				j.AccountId, j.Source = uint64(g.accounts+1000), pb.TargetSource_FOLLOWERS
			} else {
				j.Source, j.InlinePackage = pb.TargetSource_PACKAGE, []byte("not a package")
			}
		case x < 62:
			j.Source = pb.TargetSource_FOLLOWERS
			sub.size = g.fans[acc-1].GetCardinality()
		case x < 87:
			j.Source = pb.TargetSource_PACKAGE
			pkg := roaring.BitmapOf(sample(g.fans[acc-1], 2)...)
			for range 100 {
				pkg.Add(g.uin()) // some non-followers: the relation filter removes them
			}
			sub.size = pkg.GetCardinality()
			data, err := numpkg.Encode(pkg)
			if err != nil {
				return nil, err
			}
			if len(data) < 512<<10 {
				j.InlinePackage = data
			} else if j.PackageUri, err = s.Packages.Put(ctx, j.JobId+".upload", pkg); err != nil {
				return nil, err
			}
		default:
			j.Source, j.Tags = pb.TargetSource_TAGS, []string{fmt.Sprintf("vip-%d", acc)}
			sub.size = g.fans[acc-1].GetCardinality() / 3
		}
		rec, err := streams.NewRecord(ns+schemas.TopicJobs, []byte(j.JobId), j)
		if err != nil {
			return nil, err
		}
		cl.Produce(ctx, rec, nil)
		out = append(out, sub)
	}
	return out, cl.Flush(ctx)
}

func (g *traffic) waitJobs(ctx context.Context, s *push.Stack, jobs []submitted, timeout time.Duration) error {
	bar := newProgress("jobs finished", int64(len(jobs)))
	deadline := time.Now().Add(timeout)
	for {
		done := 0
		for _, j := range jobs {
			switch s.Planner.State(j.job.JobId) {
			case pb.JobState_COMPLETED, pb.JobState_REJECTED, pb.JobState_FAILED:
				done++
			}
		}
		bar.set(int64(done))
		if done == len(jobs) {
			bar.done()
			return nil
		}
		if err := s.Err(); err != nil {
			bar.done()
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			bar.done()
			return fmt.Errorf("loadgen: %d of %d jobs finished in %v", done, len(jobs), timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// summary reads the report topic back and checks every job: nobody
// delivered twice, and each malformed job refused.
func (g *traffic) summary(ctx context.Context, bs []string, ns string, s *push.Stack, jobs []submitted, churned int64) error {
	delivered := map[string]*roaring.Bitmap{}
	var dup uint64
	var filtered, onLogin uint64
	err := streams.ReadToEnd(ctx, bs, ns+schemas.TopicReports, func(r *kgo.Record) error {
		var rep pb.DeliveryReport
		if streams.Decode(r, &rep) != nil {
			return nil
		}
		set := roaring.New()
		if len(rep.Uins) > 0 {
			if err := set.UnmarshalBinary(rep.Uins); err != nil {
				return err
			}
		} else {
			set.Add(uint32(rep.Uin))
		}
		switch rep.Status {
		case pb.DeliveryStatus_FILTERED:
			filtered += set.GetCardinality()
			return nil
		case pb.DeliveryStatus_DELIVERED_ON_LOGIN:
			onLogin += set.GetCardinality()
		case pb.DeliveryStatus_QUEUED_OFFLINE:
			return nil // counted by the offline queues
		}
		d := delivered[rep.JobId]
		if d == nil {
			d = roaring.New()
			delivered[rep.JobId] = d
		}
		dup += d.AndCardinality(set)
		d.Or(set)
		return nil
	})
	if err != nil {
		return err
	}
	states := map[string]int{}
	var refusedWrong []string
	var total uint64
	for _, j := range jobs {
		st := s.Planner.State(j.job.JobId)
		states[st.String()]++
		bad := st == pb.JobState_REJECTED || st == pb.JobState_FAILED
		if bad != j.bad {
			refusedWrong = append(refusedWrong, fmt.Sprintf("%s (%s)", j.job.JobId, st))
		}
		if d := delivered[j.job.JobId]; d != nil {
			total += d.GetCardinality()
		}
	}
	var names []string
	for k := range states {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", k, states[k]))
	}
	queued, _ := s.Offline.Stats()
	fmt.Printf("jobs: %s\n", strings.Join(parts, " "))
	fmt.Printf("messages delivered: %d (of which %d on login), %d filtered, %d queued offline; %d login/logout churn events\n",
		total, onLogin, filtered, queued, churned)
	fmt.Printf("fan-list mirror: %.1f MiB for %d accounts\n", float64(s.Mirror.SizeInBytes())/(1<<20), g.accounts)
	if dup > 0 {
		return fmt.Errorf("loadgen: %d messages delivered twice", dup)
	}
	if len(refusedWrong) > 0 {
		return fmt.Errorf("loadgen: jobs refused or accepted wrongly: %s", strings.Join(refusedWrong, ", "))
	}
	fmt.Println("check: nobody got a job's message twice; every malformed job refused, every other one completed")
	return nil
}
