package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	push "surge/processors/push/app"
	walletapp "surge/processors/wallet/app"
	"surge/processors/wallet/auth"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// A broker of a three-broker cluster (replication 3, min.insync.replicas
// 2) is killed with -9 while the wallet takes grants and push-presence
// takes logins, each service its own process: the one that leads most of
// the wallet's token partitions. Clients retry what was not answered.
// Afterwards every balance equals the distinct grants accepted (nothing
// lost, nothing booked twice), every login is in the presence output, and
// both services went on without a restart. The recovery times are logged
// as "fault:" lines (scripts/bench-faults.sh keeps them in bench/).
func TestBrokerKill9(t *testing.T) {
	// Not parallel: it loads both cores for a while, and the kill -9 tests
	// beside it count on answers within their clients' timeouts.
	conf := streamstest.KafkaCluster(t)
	rdb, ok := streamstest.RedisClient(t)
	if !ok {
		t.Skip("no real redis: set SURGE_TEST_REDIS")
	}
	kc := streams.Seeds(strings.Split(conf["SURGE_KAFKA_BROKERS"], ",")...)
	script := conf["KAFKA_CLUSTER_SCRIPT"]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := streamstest.Unique("faults") + "."
	cl := streamstest.Client(t, kc)
	if err := streams.EnsureTopics(ctx, cl, streams.Replication{}, dedupe(append(push.Topics(ns), walletapp.Topics(ns)...))...); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	app := auth.Key{ID: "rain-1", App: "rain", Secret: []byte(strings.Repeat("k", 32))}
	user := auth.Key{ID: "u-1", Secret: []byte(strings.Repeat("u", 32))}
	enc := base64.RawURLEncoding.EncodeToString
	env := []string{"SURGE_KAFKA_BROKERS=" + conf["SURGE_KAFKA_BROKERS"], "SURGE_REDIS_ADDR=" + rdb.Options().Addr,
		"SURGE_PUSH_NAMESPACE=" + ns, "SURGE_WALLET_NAMESPACE=" + ns, "SURGE_WALLET_HTTP_ADDR=" + addr, "SURGE_LOG_LEVEL=info",
		"SURGE_WALLET_KEY_SEED=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32)),
		"SURGE_WALLET_APP_KEYS=rain:rain-1:" + enc(app.Secret), "SURGE_WALLET_USER_KEYS=u-1:" + enc(user.Secret),
		"TMPDIR=" + t.TempDir()}
	dir := t.TempDir()
	wallet := runCommand(t, env, "wallet", "wallet", "--wallet.dir="+dir+"/wallet")
	presence := runService(t, env, "presence", "push-presence", "--push.dir="+dir+"/presence")
	c := walletClient{t: t, base: "http://" + addr, app: app, users: auth.NewUsers([]auth.Key{user}), hc: &http.Client{Timeout: 5 * time.Second}}
	waitFor(t, ctx, "the wallet serving", func() bool {
		code, _, err := c.do("GET", "/v1/users/u0/balance", "", c.asUser("u0"))
		return err == nil && code == 200
	})

	// Load: grants from 8 callers, logins from one producer, until stop.
	const users = 20
	var (
		mu        sync.Mutex
		granted   = map[string]int64{}
		answered  []time.Time // when each grant was answered 200
		nextGrant atomic.Int64
		logins    atomic.Int64
	)
	load, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for load.Err() == nil {
				i := nextGrant.Add(1)
				act, amount := fmt.Sprintf("u%d", i%users), 1+i%7
				body := fmt.Sprintf(`{"orderNo":"%s_rain_r%d_1_1","actId":"%s","activityId":"spring","sceneId":"rain","rainId":"r%d","awardType":"CASH","stage":1,"amount":%d}`,
					act, i, act, i, amount)
				for ctx.Err() == nil { // a grant started is retried to its answer
					code, _, err := c.do("POST", "/v1/grants", body, c.asApp)
					if err == nil && code == 200 {
						mu.Lock()
						granted[act] += amount
						answered = append(answered, time.Now())
						mu.Unlock()
						break
					}
					if err == nil && code != 503 && code != 429 {
						t.Errorf("grant %d: %d", i, code)
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		pcl := streamstest.Client(t, kc)
		for u := uint32(1); load.Err() == nil; {
			r, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
			if err := pcl.ProduceSync(ctx, r).FirstErr(); err != nil {
				continue // the same uin again: its produce was not acknowledged
			}
			logins.Store(int64(u))
			u++
			time.Sleep(5 * time.Millisecond)
		}
	}()

	time.Sleep(4 * time.Second)
	victim := busiestLeader(t, cl, ns+schemas.TopicTokens)
	killedAt := time.Now()
	if out, err := exec.Command(script, "kill", fmt.Sprint(victim)).CombinedOutput(); err != nil {
		t.Fatalf("kill broker %d: %v\n%s", victim, err, out)
	}
	t.Cleanup(func() { _ = exec.Command(script, "restart", fmt.Sprint(victim)).Run() })
	time.Sleep(20 * time.Second) // the cluster runs on two brokers
	stopLoad()
	wg.Wait()

	// Every balance is exactly what was granted.
	c.waitBalances(users, func(act string) int64 { return granted[act] })
	// Every acknowledged login reached the presence output.
	n := uint32(logins.Load())
	seen := map[uint64]bool{}
	streamstest.ReadUntil(t, kc, ns+schemas.TopicPresence, true, func(recs []*kgo.Record) bool {
		for _, r := range recs {
			var ev pb.LoginEvent
			if streams.Decode(r, &ev) == nil && ev.Online {
				seen[ev.Uin] = true
			}
		}
		return len(seen) >= int(n)
	}, 90*time.Second, 0)
	for u := uint64(1); u <= uint64(n); u++ {
		if !seen[u] {
			t.Fatalf("login of uin %d (of %d acknowledged) never reached the presence output", u, n)
		}
	}
	// Neither service restarted or stopped.
	for _, s := range []*service{wallet, presence} {
		if s.cmd.ProcessState != nil {
			t.Fatalf("%s exited during the broker's death", s.name)
		}
	}
	mu.Lock()
	gap, after := longestGap(answered, killedAt)
	total := len(answered)
	mu.Unlock()
	t.Logf("fault: broker %d (leader of most %s partitions) killed -9 under load; %d grants answered, %d logins", victim, "wallet.tokens", total, n)
	t.Logf("fault: longest pause in answered grants around the kill: %s; first grant answered %s after the kill", gap.Round(time.Millisecond), after.Round(time.Millisecond))
}

// busiestLeader is the broker that leads most of topic's partitions.
func busiestLeader(t *testing.T, cl *kgo.Client, topic string) int32 {
	t.Helper()
	td, err := kadm.NewClient(cl).ListTopics(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	count := map[int32]int{}
	for _, p := range td[topic].Partitions {
		count[p.Leader]++
	}
	best, most := int32(-1), -1
	for b, n := range count {
		if n > most || n == most && b < best {
			best, most = b, n
		}
	}
	return best
}

// longestGap is the longest time between two answers that spans from
// before to after at, and how long after at the first answer came.
func longestGap(times []time.Time, at time.Time) (gap, after time.Duration) {
	ts := append([]time.Time(nil), times...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	prev := time.Time{}
	for _, x := range ts {
		if !prev.IsZero() && x.Sub(prev) > gap && !x.Before(at) {
			gap = x.Sub(prev)
		}
		if after == 0 && x.After(at) {
			after = x.Sub(at)
		}
		prev = x
	}
	return gap, after
}

// A broker of the three-broker cluster is killed with -9 while a send
// job goes out: the broker leading most partitions of push.reports, with
// presence, the planner and two executors each their own process. The job
// completes on the two brokers left, and every follower gets the message
// exactly once.
func TestBrokerKill9DuringAPushJob(t *testing.T) {
	conf := streamstest.KafkaCluster(t)
	kc := streams.Seeds(strings.Split(conf["SURGE_KAFKA_BROKERS"], ",")...)
	script := conf["KAFKA_CLUSTER_SCRIPT"]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := streamstest.Backend{Kafka: kc, Real: true}
	// Small units and a short backlog: the job takes many transactions,
	// so the kill lands in the middle of it.
	bed := newPushBedReplicated(t, ctx, b, streams.Replication{}, "bkpush",
		"SURGE_PUSH_UNIT_SIZE=100", "SURGE_PUSH_MAX_BACKLOG=2", "SURGE_LOG_LEVEL=info")
	ns := bed.ns
	target := bed.onlineFollowers(30000) // 300 units
	bed.run("presence", "push-presence", "--processor.instance_id=pres")
	planner := bed.run("planner", "push-planner", "--processor.instance_id=pl")
	ea := bed.run("executor-a", "push-executor", "--push.executor_name=ea")
	eb := bed.run("executor-b", "push-executor", "--push.executor_name=eb")
	bed.ready(ctx, "ea", "eb")

	job, _ := streams.NewRecord(ns+schemas.TopicJobs, []byte("j1"), &pb.SendJob{JobId: "j1", AccountId: 1,
		Source: pb.TargetSource_FOLLOWERS, ContentId: "c1", ContentCrc: 1, Realtime: true})
	streamstest.ProduceSync(t, bed.cl, job)
	waitFor(t, ctx, "the first deliveries", func() bool {
		n := 0
		for _, k := range byExecutor(t, kc, ns, "j1") {
			n += k
		}
		return n > 0
	})
	if st := stateOf(t, kc, ns, "j1"); st == pb.JobState_COMPLETED {
		t.Fatal("the job completed before the kill: the test needs it in flight")
	}
	victim := busiestLeader(t, bed.cl, ns+schemas.TopicReports)
	killedAt := time.Now()
	if out, err := exec.Command(script, "kill", fmt.Sprint(victim)).CombinedOutput(); err != nil {
		t.Fatalf("kill broker %d: %v\n%s", victim, err, out)
	}
	t.Cleanup(func() { _ = exec.Command(script, "restart", fmt.Sprint(victim)).Run() })
	waitFor(t, ctx, "the job completed on two brokers", func() bool { return stateOf(t, kc, ns, "j1") == pb.JobState_COMPLETED })
	t.Logf("fault: broker %d (leader of most push.reports partitions) killed -9 during a job of %d targets; completed %s after the kill",
		victim, target.GetCardinality(), time.Since(killedAt).Round(100*time.Millisecond))
	r := reportsOf(t, ns, kc, "j1")
	if r.twice != 0 {
		t.Fatalf("%d messages delivered twice", r.twice)
	}
	if !r.reached.Equals(target) {
		t.Fatalf("reached %d users, want the %d followers", r.reached.GetCardinality(), target.GetCardinality())
	}
	for _, s := range []*service{planner, ea, eb} {
		if s.cmd.ProcessState != nil {
			t.Fatalf("%s exited during the broker's death", s.name)
		}
	}
}
