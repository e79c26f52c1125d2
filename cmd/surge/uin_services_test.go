package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	uinapp "surge/processors/uin/app"
	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// poolClient calls one uin-pool instance's allocation API.
type poolClient struct {
	addr, key string
	hc        *http.Client
}

func (c poolClient) allocate(count int) ([]uint32, int, error) {
	req, _ := http.NewRequest("POST", fmt.Sprintf("http://%s/v1/uins?count=%d", c.addr, count), nil)
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Uins []uint32 `json:"uins"`
	}
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return nil, resp.StatusCode, err
		}
	}
	return body.Uins, resp.StatusCode, nil
}

func stepKinds(ss []*pb.RecycleStep) []pb.RecycleStepKind {
	var k []pb.RecycleStepKind
	for _, s := range ss {
		k = append(k, s.Step)
	}
	return k
}

// The uin services run as separate processes: the tracker, two recycle
// controllers, the timer service and two pool instances, fed only through
// topics (registrations, usage) and the allocation API. A recycle
// controller and a pool instance are killed with -9 mid-run and
// restarted: every abandoned registration is recycled exactly once, an
// account in use is never touched, one that logs in during its ban is
// never recycled, and no uin is allocated twice across the two pools;
// the dead pool's lease returns to the central pool.
func TestUinServicesSurviveKill9(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ns := streamstest.Unique("uinsvc") + "."
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cl := streamstest.Client(t, b.Kafka)
		if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, uinapp.Topics(ns)...); err != nil {
			t.Fatal(err)
		}
		secret := make([]byte, 32)
		_, _ = rand.Read(secret)
		key := hex.EncodeToString(secret)
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_REDIS_ADDR=" + rdb.Options().Addr,
			"SURGE_UIN_NAMESPACE=" + ns, "SURGE_UIN_CHECKPOINTS=1s,2s,3s,4s", "SURGE_UIN_BAN_ABANDONED=20s",
			"SURGE_UIN_COOL_DOWN_ABANDONED=300ms", "SURGE_UIN_TICKET_TTL=1m", "SURGE_UIN_POOL_KEYS=test:" + key,
			"SURGE_UIN_POOL_LEASE_TTL=2s", "SURGE_UIN_POOL_LOCAL=40", "SURGE_PROCESSOR_SESSION_TIMEOUT=6s",
			"SURGE_PROCESSOR_STATIC_MEMBERSHIP=true", "SURGE_LOG_LEVEL=info"}
		dir := t.TempDir()
		svc := func(name, component string) *service {
			return runService(t, env, name, component, "--processor.instance_id="+name, "--uin.dir="+dir+"/"+name)
		}
		pa, pbAddr := freePort(t), freePort(t)
		pool1 := runService(t, env, "pool-1", "uin-pool", "--processor.instance_id=pool-1", "--uin.pool_addr="+pa)
		pool2 := runService(t, env, "pool-2", "uin-pool", "--processor.instance_id=pool-2", "--uin.pool_addr="+pbAddr)
		svc("tracker", "uin-tracker")
		recyclers := []*service{svc("recycle-1", "uin-recycle"), svc("recycle-2", "uin-recycle")}
		svc("timers", "uin-timers")

		// The central pool starts with 3,000 uins from a fresh range.
		central := journaledPool(t, b.Kafka, rdb, ns)
		var seed []uint32
		for u := uint32(2_000_000); u < 2_003_000; u++ {
			seed = append(seed, u)
		}
		if _, err := central.Insert(ctx, seed); err != nil {
			t.Fatal(err)
		}

		// Registrations as a registration service publishes them: 200
		// abandoned (never completed), 20 of them log in during the ban,
		// and 20 completed and in use (a login a day after registering).
		const abandoned, active = 200, 20
		now := time.Now()
		var recs []*kgo.Record
		add := func(topic string, uin uint64, m proto.Message) {
			rec, err := streams.NewRecord(ns+topic, schemas.UinKey(uint32(uin)), m)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, rec)
		}
		for u := uint64(30_001); u <= 30_000+abandoned; u++ {
			add(schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, Username: fmt.Sprintf("u%d", u), AtMs: now.UnixMilli()})
		}
		for u := uint64(40_001); u <= 40_000+active; u++ {
			add(schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, Username: fmt.Sprintf("a%d", u), AtMs: now.UnixMilli(), Completed: true})
			add(schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: recycling.KindLogin, AtMs: now.Add(25 * time.Hour).UnixMilli(), Source: "auth"})
		}
		// Bad input on the input topics: dead-lettered, nothing crashes.
		for _, topic := range []string{schemas.TopicRegistrations, schemas.TopicUsage, schemas.TopicPool} {
			recs = append(recs, &kgo.Record{Topic: ns + topic, Key: []byte("junk"), Value: []byte("\xff\xfe not protobuf")})
		}
		streamstest.ProduceSync(t, cl, recs...)

		// Steps as a read_committed consumer sees them.
		applied := readSteps(ctx, t, b.Kafka, ns)
		steps, mu := applied.byUin, &applied.mu
		bannedSince := func(u uint64) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			ss := steps[u]
			if len(ss) == 0 || ss[len(ss)-1].Step != pb.RecycleStepKind_BAN {
				return time.Hour
			}
			return time.Since(time.UnixMilli(ss[len(ss)-1].AtMs))
		}

		// Allocation: two clients per pool instance until 2,400 uins.
		clients := []poolClient{{pa, key, &http.Client{Timeout: 5 * time.Second}}, {pbAddr, key, &http.Client{Timeout: 5 * time.Second}}}
		for _, c := range []poolClient{{pa, "", http.DefaultClient}, {pa, strings.Repeat("0", 64), http.DefaultClient}} {
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, code, err := c.allocate(1)
				if err == nil {
					if code != http.StatusUnauthorized {
						t.Fatalf("allocation with key %q answered %d, want 401", c.key, code)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pool-1 never answered: %v", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		const want = 2400
		alloc := allocateUntil(ctx, clients, 4, want)
		got, total, wg := alloc.got, &alloc.total, &alloc.wg
		for total.Load() < want/3 {
			time.Sleep(5 * time.Millisecond)
		}
		pool1.kill()
		t.Logf("killed pool-1 with %d uins allocated", total.Load())
		pool1.start()

		// Kill a recycle controller mid-way through the tickets.
		for applied.applied.Load() < abandoned*2 {
			if ctx.Err() != nil {
				t.Fatal("recycling made no progress")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// 20 of the banned log in before their backup.
		var logins []*kgo.Record
		loggedIn := map[uint64]bool{}
		// Only uins banned under 10 s ago: their backup is 10 s away or more,
		// so the login is consumed before the backup request even through
		// the controller's restart below; and a burst of bans stays that
		// recent for 10 s, however late this test's reader of the steps is
		// on a loaded machine (at 8 s and "under a second" it once found
		// none and waited out its context). (Usage and requests are two topics:
		// a login consumed after its backup request was applied comes too
		// late; the margin is the ban's length, days in production.)
		for len(logins) < 20 && ctx.Err() == nil {
			for u := uint64(30_001); len(logins) < 20 && u <= 30_000+abandoned; u++ {
				if !loggedIn[u] && bannedSince(u) < 10*time.Second {
					rec, _ := streams.NewRecord(ns+schemas.TopicUsage, schemas.UinKey(uint32(u)), &pb.UsageEvent{Uin: u, Kind: recycling.KindLogin, AtMs: time.Now().UnixMilli(), Source: "auth"})
					logins = append(logins, rec)
					loggedIn[u] = true
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		streamstest.ProduceSync(t, cl, logins...)
		recyclers[0].kill()
		t.Logf("killed recycle-1 with %d steps applied; %d users logged in during their ban", applied.applied.Load(), len(logins))
		recyclers[0].start()
		wg.Wait()

		// Every abandoned uin: the full cycle once, or stopped after its
		// ban if it logged in; active accounts: nothing.
		full := []pb.RecycleStepKind{pb.RecycleStepKind_TICKET_GRANTED, pb.RecycleStepKind_BAN, pb.RecycleStepKind_BACKUP,
			pb.RecycleStepKind_DELETE, pb.RecycleStepKind_COOL_DOWN, pb.RecycleStepKind_RELEASE}
		stopped := []pb.RecycleStepKind{pb.RecycleStepKind_TICKET_GRANTED, pb.RecycleStepKind_BAN, pb.RecycleStepKind_STOPPED}
		wantSteps := (abandoned-len(logins))*len(full) + len(logins)*len(stopped)
		for applied.applied.Load() < int64(wantSteps) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // anything applied twice would show by now
		mu.Lock()
		bad := 0
		for u := uint64(30_001); u <= 30_000+abandoned; u++ {
			w := full
			if loggedIn[u] {
				w = stopped
			}
			if k := stepKinds(steps[u]); !slices.Equal(k, w) {
				if bad++; bad <= 10 {
					t.Errorf("uin %d: steps %v, want %v", u, k, w)
				}
			}
		}
		// An active account may see a ticket refused, or granted and
		// stopped by its login before anything is done to it (the tracker
		// and the controller read its usage on another topic than its
		// registration and the request: under load, later), never a ban.
		for u := uint64(40_001); u <= 40_000+active; u++ {
			k := stepKinds(steps[u])
			harmless := len(k) == 0 || slices.Equal(k, []pb.RecycleStepKind{pb.RecycleStepKind_STOPPED}) ||
				slices.Equal(k, []pb.RecycleStepKind{pb.RecycleStepKind_TICKET_GRANTED, pb.RecycleStepKind_STOPPED})
			if !harmless {
				t.Errorf("active uin %d touched: %v", u, k)
			}
		}
		mu.Unlock()

		// No uin allocated twice, across both pools and the kill.
		for u, n := range got {
			if n != 1 {
				t.Errorf("uin %d allocated %d times", u, n)
			}
			if u >= 40_001 && u <= 40_000+active {
				t.Errorf("active account's uin %d allocated", u)
			}
		}
		// The dead pool's lease comes back (2 s after its last heartbeat),
		// and a graceful stop gives the live pools' leases back too: what
		// is neither allocated nor pooled is at most what was in flight at
		// pool-1 when it died (committed, answer lost).
		time.Sleep(3 * time.Second)
		for _, p := range []*service{pool1, pool2} {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			_ = p.cmd.Wait()
		}
		leased, _ := central.Leased(ctx)
		size, _ := central.Size(ctx)
		recycled := int64(abandoned - len(logins))
		lost := int64(len(seed)) + recycled - size - leased - int64(len(got))
		t.Logf("allocated %d distinct uins; pool holds %d; leased %d; %d committed but unanswered at the kill", len(got), size, leased, lost)
		if leased != 0 {
			owners, _ := rdb.SMembers(ctx, uinkeys.Pool(ns)+"leases").Result()
			for _, o := range owners {
				n, _ := rdb.SCard(ctx, uinkeys.Pool(ns)+"lease:"+o).Result()
				alive, _ := rdb.Exists(ctx, uinkeys.Pool(ns)+"alive:"+o).Result()
				t.Logf("lease of %s: %d uins (alive %d)", o, n, alive)
			}
		}
		if leased != 0 || lost < 0 || lost > 10 {
			t.Errorf("leased %d (want 0), unaccounted %d (want 0..10, the requests in flight at the kill)", leased, lost)
		}

		// The bad records were dead-lettered with a reason.
		dl := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicDeadLetter, false, 3, 30*time.Second, time.Second)
		if len(dl) < 3 {
			t.Errorf("%d dead letters, want the 3 bad records", len(dl))
		}
		for _, r := range dl {
			if reason, _ := streams.Header(r, streams.HeaderDLQReason); len(reason) == 0 {
				t.Errorf("dead letter without a reason: %v", r.Headers)
			}
		}
	})
}

// journaledPool is namespace ns's central pool as the services see it,
// journaling to uin.pool, there (rebuilt from the topic if need be).
func journaledPool(t *testing.T, kc streams.Cluster, rdb redis.UniversalClient, ns string) *pool.Central {
	t.Helper()
	s := uinapp.New(kc, rdb, uinapp.Options{Namespace: ns, Buckets: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.EnsurePool(ctx); err != nil {
		t.Fatal(err)
	}
	return s.Pool
}

// allocations are callers allocating uins from pool instances over the API
// until want uins are handed out: what each was handed, how often.
type allocations struct {
	mu          sync.Mutex
	got         map[uint32]int
	total       atomic.Int64
	unavailable atomic.Int64 // answers 503 (down, rebuilding, refilling)
	wg          sync.WaitGroup
}

// allocateUntil starts callers (round robin over clients) allocating 5
// uins a call until want are handed out or ctx ends.
func allocateUntil(ctx context.Context, clients []poolClient, callers, want int) *allocations {
	a := &allocations{got: map[uint32]int{}}
	for i := range callers {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			c := clients[i%len(clients)]
			for a.total.Load() < int64(want) && ctx.Err() == nil {
				us, code, err := c.allocate(5)
				if err != nil || code != 200 {
					if code == http.StatusServiceUnavailable {
						a.unavailable.Add(1)
					}
					time.Sleep(20 * time.Millisecond) // the instance is down, rebuilding or refilling
					continue
				}
				a.mu.Lock()
				for _, u := range us {
					a.got[u]++
				}
				a.mu.Unlock()
				a.total.Add(int64(len(us)))
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return a
}

// handedOut is how many distinct uins were handed out so far.
func (a *allocations) handedOut() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.got)
}

// appliedSteps reads uin.recycle-steps of ns as a read_committed consumer
// sees them, per uin, until ctx ends.
type appliedSteps struct {
	mu      sync.Mutex
	byUin   map[uint64][]*pb.RecycleStep
	applied atomic.Int64
}

func readSteps(ctx context.Context, t *testing.T, kc streams.Cluster, ns string) *appliedSteps {
	s := &appliedSteps{byUin: map[uint64][]*pb.RecycleStep{}}
	cl := streamstest.Client(t, kc, kgo.ConsumeTopics(ns+schemas.TopicRecycleSteps),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	go func() {
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				var st pb.RecycleStep
				if streams.Decode(r, &st) != nil {
					return
				}
				s.mu.Lock()
				s.byUin[st.Uin] = append(s.byUin[st.Uin], &st)
				s.mu.Unlock()
				s.applied.Add(1)
			})
		}
	}()
	return s
}
