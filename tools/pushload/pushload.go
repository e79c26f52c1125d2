// Package pushload generates realistic mass-push traffic and drives the
// push services with it by producing to their topics only: accounts,
// follower lists (Zipf over accounts), tags, logins and churn, and jobs of
// every source, size and priority, a few of them malformed. It follows
// push.job-transitions until every job ended, reads push.reports back, and
// fails if a user got a job's message twice, a targeted online user got
// nothing, or a malformed job was accepted. `surge loadgen` runs it,
// against the deployed services or ones it starts in process.
package pushload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"surge/schemas/uinset"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	push "surge/processors/push/app"
	"surge/processors/push/directory"
	"surge/processors/push/numpkg"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/tools/progress"
)

// Config is the traffic's shape.
type Config struct {
	Users, Accounts, Jobs int
	Churn                 int     // logins and logouts per second while jobs run
	Zipf                  float64 // exponent of the followers' distribution over accounts
	Online                float64 // share of users online at the start
	Seed                  int64
	Timeout               time.Duration // for the jobs to end
}

// Run drives the push services on cluster kc (topics behind ns) through
// cl. stackErr reports a failure of services run in this process (nil
// for deployed ones); stopStack stops them once the jobs ended.
func Run(ctx context.Context, cl *kgo.Client, kc streams.Cluster, ns string, c Config, stackErr func() error, stopStack func()) error {
	g := newTraffic(c)
	fmt.Fprintf(os.Stderr, "loadgen: %d users, %d accounts (Zipf s=%.2f), %d jobs, churn %d/s\n",
		g.users, g.accounts, g.zipfS, g.jobs, g.churn)
	if err := g.followers(ctx, cl, ns); err != nil {
		return err
	}
	if err := g.logins(ctx, cl, ns); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	fmt.Fprintln(os.Stderr, "loadgen: waiting for the planner to apply the directory")
	if err := streams.WaitConsumed(wctx, kc, push.PlannerGroup(ns), directory.New(ns).Topics()...); err != nil {
		return err
	}
	fctx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	jobsView, err := followJobs(fctx, kc, ns)
	if err != nil {
		return err
	}

	churnCtx, stopChurn := context.WithCancel(ctx)
	var churned atomic.Int64
	go g.churnLoop(churnCtx, cl, ns, &churned)
	jobs, err := g.submitJobs(ctx, cl, ns)
	if err != nil {
		stopChurn()
		return err
	}
	waitErr := g.waitJobs(wctx, jobsView, jobs, stackErr)
	stopChurn()
	// Let the offline queues catch up with the last logins and batches.
	settleErr := streams.WaitConsumed(wctx, kc, ns+"push-offline", ns+schemas.TopicLogin, ns+schemas.TopicOffline)
	sumErr := g.summary(ctx, kc, ns, jobsView, jobs, churned.Load())
	stopStack() // the services run in this process, if any
	return errors.Join(waitErr, settleErr, sumErr)
}

// jobStates follows push.job-transitions: every job's latest state.
type jobStates struct {
	mu sync.Mutex
	m  map[string]pb.JobState
}

func (j *jobStates) state(id string) pb.JobState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.m[id]
}

func followJobs(ctx context.Context, kc streams.Cluster, ns string) (*jobStates, error) {
	j := &jobStates{m: map[string]pb.JobState{}}
	_, err := streams.FollowTable(ctx, kc, ns+schemas.TopicJobTransitions, func(r *kgo.Record) {
		var t pb.JobTransition
		if streams.Decode(r, &t) == nil {
			j.mu.Lock()
			j.m[t.JobId] = t.To
			j.mu.Unlock()
		}
	})
	return j, err
}

type traffic struct {
	users, accounts, jobs, churn int
	zipfS, online                float64
	rng                          *rand.Rand
	fans                         []*roaring.Bitmap // by account index (account id = index+1)
	onlineSet                    *roaring.Bitmap
}

func newTraffic(c Config) *traffic {
	return &traffic{users: c.Users, accounts: c.Accounts, jobs: c.Jobs, churn: c.Churn, zipfS: c.Zipf, online: c.Online,
		rng: rand.New(rand.NewSource(c.Seed)), onlineSet: roaring.New()}
}

func (g *traffic) uin() uint32 { return uint32(1 + g.rng.Intn(g.users)) }

// followers builds the follower lists: account of rank r has about
// users/2 / r^s followers (at least 10), registered in the source store
// and published as fan-list deltas.
func (g *traffic) followers(ctx context.Context, cl *kgo.Client, ns string) error {
	total := 0
	sizes := make([]int, g.accounts)
	for r := range g.accounts {
		sizes[r] = max(10, int(float64(g.users/2)/math.Pow(float64(r+1), g.zipfS)))
		total += sizes[r]
	}
	bar := progress.New("follows", int64(total))
	n := 0
	for r := range g.accounts {
		id := uint64(r + 1)
		cl.Produce(ctx, directory.AccountRecord(ns, &pb.AccountInfo{AccountId: id, Type: "subscription",
			Followers: uint64(sizes[r]), AtMs: time.Now().UnixMilli()}), nil)
		set := roaring.New()
		for set.GetCardinality() < uint64(sizes[r]) {
			set.Add(g.uin())
		}
		g.fans = append(g.fans, set)
		it := set.Iterator()
		for it.HasNext() {
			cl.Produce(ctx, directory.FollowRecord(ns, id, it.Next(), true), nil)
			if n++; n%50000 == 0 {
				bar.Set(int64(n))
			}
		}
		// Tags for targeting: a third of each account's followers are "vip".
		for _, u := range sample(set, 3) {
			cl.Produce(ctx, directory.TagRecord(ns, fmt.Sprintf("vip-%d", id), u, false), nil)
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	bar.Set(int64(n))
	bar.Done()
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
	rec, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(uin), &pb.LoginEvent{Uin: uint64(uin), Online: on, AtMs: time.Now().UnixMilli()})
	cl.Produce(ctx, rec, nil)
}

func (g *traffic) logins(ctx context.Context, cl *kgo.Client, ns string) error {
	n := int(float64(g.users) * g.online)
	bar := progress.New("logins", int64(n))
	for i := 0; g.onlineSet.GetCardinality() < uint64(n); i++ {
		u := g.uin()
		if g.onlineSet.CheckedAdd(u) {
			g.login(ctx, cl, ns, u, true)
		}
		if i%50000 == 0 {
			bar.Set(int64(g.onlineSet.GetCardinality()))
		}
	}
	err := cl.Flush(ctx)
	bar.Set(int64(n))
	bar.Done()
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
	want *roaring.Bitmap // the job's package: every uin must be accounted for in push.reports
}

// submitJobs submits jobs: accounts by Zipf rank (big accounts send more),
// sources mixed (60% followers, 25% package, 15% tags), priorities 0..9,
// 5% real-time, 2% malformed.
func (g *traffic) submitJobs(ctx context.Context, cl *kgo.Client, ns string) ([]submitted, error) {
	zipf := rand.NewZipf(g.rng, max(g.zipfS, 1.01), 1, uint64(g.accounts-1))
	var out []submitted
	run := time.Now().Unix() // job ids are unique across runs on one broker
	for i := range g.jobs {
		acc := zipf.Uint64() + 1
		j := &pb.SendJob{JobId: fmt.Sprintf("job-%d-%05d", run, i), AccountId: acc, ContentId: fmt.Sprintf("content-%d", i),
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
			sub.want = g.fans[acc-1]
		case x < 87:
			j.Source = pb.TargetSource_PACKAGE
			pkg := roaring.BitmapOf(sample(g.fans[acc-1], 2)...)
			for range 100 {
				pkg.Add(g.uin()) // some non-followers: the relation filter removes them
			}
			sub.want = pkg
			data, err := numpkg.Encode(pkg)
			if err != nil {
				return nil, err
			}
			if len(data) < 512<<10 {
				j.InlinePackage = data
			} else { // an upload: chunks on push.packages, before the job
				id := j.JobId + ".upload"
				if err := cl.ProduceSync(ctx, numpkg.Chunks(ns+schemas.TopicPackages, id, data)...).FirstErr(); err != nil {
					return nil, err
				}
				j.PackageUri = numpkg.TopicURI(ns+schemas.TopicPackages, id)
			}
		default:
			j.Source, j.Tags = pb.TargetSource_TAGS, []string{fmt.Sprintf("vip-%d", acc)}
			sub.want = roaring.BitmapOf(sample(g.fans[acc-1], 3)...)
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

func (g *traffic) waitJobs(ctx context.Context, states *jobStates, jobs []submitted, stackErr func() error) error {
	// A job whose targets have no quota released yet waits for the
	// day's next release (WAITING_QUOTA), which may be hours away: it is
	// settled for the run, and the summary names it.
	bar := progress.New("jobs finished or waiting for quota", int64(len(jobs)))
	for {
		done := 0
		for _, j := range jobs {
			switch states.state(j.job.JobId) {
			case pb.JobState_COMPLETED, pb.JobState_REJECTED, pb.JobState_FAILED, pb.JobState_WAITING_QUOTA:
				done++
			}
		}
		bar.Set(int64(done))
		if done == len(jobs) {
			bar.Done()
			return nil
		}
		if err := stackErr(); err != nil {
			bar.Done()
			return err
		}
		if ctx.Err() != nil {
			bar.Done()
			return fmt.Errorf("loadgen: %d of %d jobs finished or waiting for quota before loadgen.timeout", done, len(jobs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// summary reads the report topic back and checks every job: nobody
// delivered twice, every target accounted for (delivered, queued offline
// or filtered with a reason), and each malformed job refused.
func (g *traffic) summary(ctx context.Context, kc streams.Cluster, ns string, states *jobStates, jobs []submitted, churned int64) error {
	delivered, accounted := map[string]*roaring.Bitmap{}, map[string]*roaring.Bitmap{}
	var dup uint64
	var filtered, onLogin, queued uint64
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicReports, func(r *kgo.Record) error {
		var rep pb.DeliveryReport
		if streams.Decode(r, &rep) != nil {
			return nil
		}
		set := roaring.New()
		if len(rep.Uins) > 0 {
			var err error
			if set, err = uinset.Decode(rep.Uins); err != nil {
				return err
			}
		} else {
			set.Add(uint32(rep.Uin))
		}
		if rep.Status != pb.DeliveryStatus_DELIVERED_ON_LOGIN {
			if accounted[rep.JobId] == nil {
				accounted[rep.JobId] = roaring.New()
			}
			accounted[rep.JobId].Or(set)
		}
		switch rep.Status {
		case pb.DeliveryStatus_FILTERED:
			filtered += set.GetCardinality()
			return nil
		case pb.DeliveryStatus_DELIVERED_ON_LOGIN:
			onLogin += set.GetCardinality()
		case pb.DeliveryStatus_QUEUED_OFFLINE:
			queued += set.GetCardinality()
			return nil
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
	counts := map[string]int{}
	var refusedWrong, missed []string
	var total uint64
	waiting := 0
	for _, j := range jobs {
		st := states.state(j.job.JobId)
		counts[st.String()]++
		bad := st == pb.JobState_REJECTED || st == pb.JobState_FAILED
		if bad != j.bad {
			refusedWrong = append(refusedWrong, fmt.Sprintf("%s (%s)", j.job.JobId, st))
		}
		if d := delivered[j.job.JobId]; d != nil {
			total += d.GetCardinality()
		}
		if st == pb.JobState_WAITING_QUOTA {
			waiting++
			if accounted[j.job.JobId] != nil {
				missed = append(missed, fmt.Sprintf("%s (waiting for quota, yet %d targets reported)", j.job.JobId, accounted[j.job.JobId].GetCardinality()))
			}
			continue // reported when the next release wakes it
		}
		if !j.bad {
			got := accounted[j.job.JobId]
			if got == nil {
				got = roaring.New()
			}
			if !got.Equals(j.want) {
				missed = append(missed, fmt.Sprintf("%s (%d of %d targets reported, %d outside its package)", j.job.JobId,
					got.AndCardinality(j.want), j.want.GetCardinality(), roaring.AndNot(got, j.want).GetCardinality()))
			}
		}
	}
	var names []string
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	fmt.Printf("jobs: %s\n", strings.Join(parts, " "))
	fmt.Printf("messages delivered: %d (of which %d on login), %d filtered, %d queued offline; %d login/logout churn events\n",
		total, onLogin, filtered, queued, churned)
	if dup > 0 {
		return fmt.Errorf("loadgen: %d messages delivered twice", dup)
	}
	if len(missed) > 0 {
		return fmt.Errorf("loadgen: jobs whose targets push.reports does not account for: %s", strings.Join(missed, ", "))
	}
	if len(refusedWrong) > 0 {
		return fmt.Errorf("loadgen: jobs refused or accepted wrongly: %s", strings.Join(refusedWrong, ", "))
	}
	if waiting > 0 {
		fmt.Printf("%d jobs wait for the day's next quota release (WAITING_QUOTA): every target of theirs had used the units released so far; nothing of theirs is sent or reported until it comes\n", waiting)
	}
	fmt.Println("check: nobody got a job's message twice; every target of every job delivered, queued offline or filtered (or, for a job waiting for quota, nothing reported yet); every malformed job refused, every other one completed or waiting for quota")
	return nil
}
