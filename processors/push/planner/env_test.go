package planner

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/directory"
	"surge/processors/push/internal/job"
	"surge/processors/push/internal/quota"
	"surge/processors/push/numpkg"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// testEnv is a planner's topics on one backend: account 7 with followers
// 1..followers, a package store, and unit queues for the named executors.
type testEnv struct {
	t     *testing.T
	ctx   context.Context
	ns    string
	kafka streams.Cluster
	admin *kgo.Client
	pkgs  *numpkg.TopicStore
	log   *slog.Logger
	wg    sync.WaitGroup
}

func newTestEnv(t *testing.T, b streamstest.Backend, followers uint32, executors ...string) *testEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	e := &testEnv{t: t, ctx: ctx, ns: streamstest.Unique("pl") + ".", kafka: b.Kafka,
		admin: streamstest.Client(t, b.Kafka), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	topics := schemas.Namespaced(e.ns, schemas.TopicJobs, schemas.TopicJobCommands, schemas.TopicJobTransitions, schemas.TopicPlannerCkpt,
		schemas.TopicExecutors, schemas.TopicReports, schemas.TopicPackages, schemas.TopicAccounts, schemas.TopicFanDelta,
		schemas.TopicTags, schemas.TopicBlacklists, schemas.TopicJobClicks, schemas.TopicTimers, schemas.TopicDeadLetter)
	for _, x := range executors {
		topics = append(topics, schemas.Topic{Name: e.ns + schemas.TopicUnits + "." + x, Partitions: 1, Retention: time.Hour})
	}
	if err := streams.EnsureTopics(ctx, e.admin, streams.OneCopy, topics...); err != nil {
		t.Fatal(err)
	}
	pkgs, err := numpkg.OpenTopicStore(ctx, b.Kafka, e.ns+schemas.TopicPackages, filepath.Join(t.TempDir(), "pkgs"), e.log)
	if err != nil {
		t.Fatal(err)
	}
	e.pkgs = pkgs
	t.Cleanup(func() {
		cancel()
		e.wg.Wait()
		time.Sleep(300 * time.Millisecond) // the package table's goroutine ends
		_ = pkgs.Close()
	})
	recs := []*kgo.Record{directory.AccountRecord(e.ns, &pb.AccountInfo{AccountId: 7, Type: "subscription"})}
	for u := uint32(1); u <= followers; u++ {
		recs = append(recs, directory.FollowRecord(e.ns, 7, u, true))
	}
	streamstest.ProduceSync(t, e.admin, recs...)
	return e
}

// run runs p, unless nil, and the fake executors until stop is called.
func (e *testEnv) run(p *Planner, xs ...*fakeExecutor) (stop func()) {
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	if p != nil {
		wg.Add(1)
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer wg.Done()
			_ = p.Run(ctx, streams.Logger(e.log), streams.InstanceID("a"))
		}()
	}
	e.runIn(ctx, &wg, xs...)
	return func() { cancel(); wg.Wait() }
}

// runPlanner runs p as instance until stop is called.
func (e *testEnv) runPlanner(p *Planner, instance string) (stop func()) {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer close(done)
		_ = p.Run(ctx, streams.Logger(e.log), streams.InstanceID(instance))
	}()
	return func() { cancel(); <-done }
}

func (e *testEnv) runIn(ctx context.Context, wg *sync.WaitGroup, xs ...*fakeExecutor) {
	e.wg.Add(len(xs))
	wg.Add(len(xs))
	for _, x := range xs {
		x.t, x.ns, x.kafka = e.t, e.ns, e.kafka
		go func() { defer e.wg.Done(); defer wg.Done(); x.run(ctx) }()
	}
}

// send publishes m on the namespaced topic, keyed by key.
func (e *testEnv) send(topic, key string, m proto.Message) {
	e.t.Helper()
	r, err := streams.NewRecord(e.ns+topic, []byte(key), m)
	if err != nil {
		e.t.Fatal(err)
	}
	streamstest.ProduceSync(e.t, e.admin, r)
}

// wait waits until job id is in state want, failing if it ends elsewhere.
func (e *testEnv) wait(p *Planner, id string, want pb.JobState) {
	e.t.Helper()
	for st := p.State(id); st != want; st = p.State(id) {
		if e.ctx.Err() != nil || job.Terminal(st) {
			e.t.Fatalf("job %s is %s, want %s (%s)", id, st, want, p.Describe(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// received waits until executor f has received want distinct units of job.
func (e *testEnv) received(p *Planner, f *fakeExecutor, job string, want int) {
	e.t.Helper()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n, _ := f.received(job); n == want {
			return
		} else if time.Now().After(end) {
			e.t.Fatalf("executor %s holds %d units of %s, want %d (%s)", f.name, n, job, want, p.Describe(job))
		}
	}
}

// withEnv is cfg with the test's brokers, namespace, log and packages.
func withEnv(cfg Config, kc streams.Cluster, pkgs numpkg.Store, ns string, log *slog.Logger) Config {
	now := cfg.Now
	cfg.Env = streams.Env{Kafka: kc, Namespace: ns, Log: log, Now: now}
	cfg.Packages = pkgs
	return cfg
}

// sameAfterRestore checks that a planner restored from the topics holds
// p's memory (p stopped).
func (e *testEnv) sameAfterRestore(p *Planner, cfg Config) {
	e.t.Helper()
	restored := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
	if err := restored.Restore(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	if a, b := memory(e.t, p), memory(e.t, restored); a != b {
		e.t.Fatalf("restored memory differs:\nlive:\n%s\nrestored:\n%s", a, b)
	}
}

// lateClock is a clock that runs from 21:30 on the latest day (today or
// before) whose six quota windows (seed 1, DefaultConfig's) have all
// released their unit by then: whatever the hour a test runs, no job of
// it waits for quota, and it stays on that day for hours.
func lateClock() func() time.Time {
	seed := DefaultConfig().QuotaSeed
	y, m, d := time.Now().Date()
	late := time.Date(y, m, d, 21, 30, 0, 0, time.Local)
	for quota.Released(late, seed) < quota.PerDay {
		late = late.AddDate(0, 0, -1)
	}
	began := time.Now()
	return func() time.Time { return late.Add(time.Since(began)) }
}
