package app_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/account"
	"surge/processors/uin/app"
	"surge/processors/uin/pool"
	"surge/processors/uin/recycle"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// TestControllerChild is a recycle controller in its own process, for the
// crash test to kill.
func TestControllerChild(t *testing.T) {
	ns := os.Getenv("SURGE_RECYCLE_CHILD_NS")
	if ns == "" {
		t.Skip("run by TestEveryStepOnceAcrossCrashesAndCompetingInstances")
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("SURGE_RECYCLE_CHILD_REDIS")})
	c := recycle.New(recycle.Config{
		Env: streams.Env{Kafka: streams.Seeds(strings.Split(os.Getenv("SURGE_RECYCLE_CHILD_BROKERS"), ",")...), Namespace: ns, Log: quiet},
		Dir: os.Getenv("SURGE_RECYCLE_CHILD_DIR"), Accounts: account.NewStore(rdb, uinkeys.Prefix(ns)), Pool: pool.NewCentral(rdb, uinkeys.Pool(ns), 1000),
		Policy: testPolicy(200 * time.Millisecond)})
	// Static membership: a restarted instance takes its partitions back
	// at once instead of after the dead one's session times out.
	_ = c.Run(context.Background(), streams.InstanceID(os.Getenv("SURGE_RECYCLE_CHILD_ID")), streams.StaticMembership(),
		streams.MaxBatch(50), streams.ClientOpts(kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond)))
}

func spawnController(t *testing.T, b streamstest.Backend, redisAddr, ns, id string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestControllerChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SURGE_RECYCLE_CHILD_NS="+ns, "SURGE_RECYCLE_CHILD_REDIS="+redisAddr,
		"SURGE_RECYCLE_CHILD_DIR="+t.TempDir(), "SURGE_RECYCLE_CHILD_BROKERS="+strings.Join(b.Kafka.Seeds, ","),
		"SURGE_RECYCLE_CHILD_ID="+id)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestEveryStepOnceAcrossCrashesAndCompetingInstances runs two controller
// processes side by side, SIGKILLs one of them at random three times while
// tickets are mid-way, and has a competing scheduler send every request a
// second time. Every step of every ticket must be applied exactly once,
// every uin deleted once and pooled once. Half the tickets come one by one
// (the tracker's grants for abandoned registrations), half in batches (a
// stock check's grants, a record per partition), so kills land in the
// middle of batches too.
func TestEveryStepOnceAcrossCrashesAndCompetingInstances(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		s := newStack(t, b, rdb, app.Options{Controllers: -1})
		ns := s.Opts.Namespace
		const singles, batched = 300, 300
		const n = singles + batched
		now := time.Now().UnixMilli()
		var recs []*kgo.Record
		for u := uint64(10_001); u <= 10_000+singles; u++ {
			recs = append(recs, rec(t, ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, AtMs: now}))
		}
		parts, err := streams.PartitionCount(context.Background(), b.Kafka, ns+schemas.TopicRecycleReqs)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, batchedGrants(t, ns+schemas.TopicRecycleReqs, parts, 20_001, 20_000+batched, recycling.Inactive, now-int64(400*24*time.Hour/time.Millisecond), now-int64(500*24*time.Hour/time.Millisecond))...)
		cl := streamstest.Client(t, b.Kafka)
		streamstest.ProduceSync(t, cl, recs...)

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The competing scheduler: every request is sent once more.
		var duplicated atomic.Int64
		dup := streamstest.Client(t, b.Kafka, kgo.ConsumeTopics(ns+schemas.TopicRecycleReqs),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		go func() {
			for ctx.Err() == nil {
				f := dup.PollFetches(ctx)
				f.EachRecord(func(r *kgo.Record) {
					if _, again := streams.Header(r, "test-duplicate"); again {
						return
					}
					c := &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value,
						Headers: append(slices.Clone(r.Headers), kgo.RecordHeader{Key: "test-duplicate", Value: []byte("1")})}
					dup.Produce(ctx, c, nil)
					duplicated.Add(int64(entries(r)))
				})
			}
		}()

		redisAddr := rdb.Options().Addr
		children := []*exec.Cmd{spawnController(t, b, redisAddr, ns, "a"), spawnController(t, b, redisAddr, ns, "b")}
		t.Cleanup(func() {
			for _, c := range children {
				_ = c.Process.Kill()
				_, _ = c.Process.Wait()
			}
		})
		start(t, s)

		// Progress: applied steps as a read_committed consumer sees them.
		var applied atomic.Int64
		prog := streamstest.Client(t, b.Kafka, kgo.ConsumeTopics(ns+schemas.TopicRecycleSteps),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		go func() {
			for ctx.Err() == nil {
				prog.PollFetches(ctx).EachRecord(func(r *kgo.Record) { applied.Add(int64(entries(r))) })
			}
		}()
		kills := 0
		for _, frac := range []float64{0.2, 0.45, 0.7} {
			for float64(applied.Load()) < frac*6*n {
				time.Sleep(5 * time.Millisecond)
			}
			i := rand.IntN(2)
			_ = children[i].Process.Signal(syscall.SIGKILL)
			_, _ = children[i].Process.Wait()
			if done := applied.Load(); done < 6*n {
				kills++
				t.Logf("killed controller %d with %d of %d steps applied", i, done, 6*n)
			}
			children[i] = spawnController(t, b, redisAddr, ns, []string{"a", "b"}[i])
		}
		if kills < 3 {
			t.Fatalf("work finished after %d kills; the test must crash controllers mid-way", kills)
		}

		got := steps(t, s, 6*n, 5*time.Second)
		bad := 0
		uins := slices.Concat(uinRange(10_001, 10_000+singles), uinRange(20_001, 20_000+batched))
		for _, u := range uins {
			if k := kinds(got[u]); !slices.Equal(k, fullCycle) {
				if bad++; bad <= 10 {
					last := ""
					if len(got[u]) > 0 {
						last = got[u][len(got[u])-1].Reason
					}
					t.Errorf("uin %d: steps %v (last: %q), want each of %v once", u, k, last, fullCycle)
				}
			}
		}
		// A duplicate request loses the compare-and-set quietly: it is not
		// bad input, so nothing is dead-lettered.
		if dl := deadLetters(t, s, 0); bad > 0 || len(dl) > 0 {
			t.Errorf("%d uins without exactly one of each step; dead letters: %q", bad, dl)
		}
		notices := map[string]int{}
		for _, r := range streamstest.ReadN(t, b.Kafka, ns+schemas.TopicDeletions, true, n, 30*time.Second, 2*time.Second) {
			notices[string(r.Key)]++
		}
		inserts := map[uint64]int{}
		// Each recycled uin's FREE (its DELETE step) and INSERT (RELEASE).
		for _, r := range streamstest.ReadN(t, b.Kafka, ns+schemas.TopicPool, true, 2*n, 30*time.Second, 2*time.Second) {
			var c pb.PoolChange
			if err := streams.Decode(r, &c); err != nil {
				t.Fatal(err)
			}
			if c.Op == pb.PoolChange_INSERT {
				inserts[c.Uin]++
			}
		}
		size, err := s.Pool.Size(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(notices) != n || len(inserts) != n || size != n {
			t.Errorf("deleted %d, pooled %d (pool holds %d), want %d each", len(notices), len(inserts), size, n)
		}
		for k, c := range notices {
			if c != 1 {
				t.Errorf("uin %x: %d deletion notices", k, c)
			}
		}
		for u, c := range inserts {
			if c != 1 {
				t.Errorf("uin %d: %d pool insertions", u, c)
			}
		}
		if duplicated.Load() < 5*n {
			t.Errorf("only %d requests duplicated", duplicated.Load())
		}
		t.Logf("%d kills, %d requests duplicated by the competing scheduler", kills, duplicated.Load())
	})
}

func uinRange(from, to uint64) []uint64 {
	var us []uint64
	for u := from; u <= to; u++ {
		us = append(us, u)
	}
	return us
}
