package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	push "surge/processors/push/app"
	"surge/processors/push/directory"
	"surge/processors/push/numpkg"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

var (
	buildOnce sync.Once
	surgeBin  string
	buildErr  error
)

// binary builds surge once per test run: the services under test are the
// command a platform deploys, each in its own OS process.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "surge-bin-")
		if err != nil {
			buildErr = err
			return
		}
		surgeBin = filepath.Join(dir, "surge")
		out, err := exec.Command("go", "build", "-o", surgeBin, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return surgeBin
}

// service is one `surge run NAME` process.
type service struct {
	t    *testing.T
	name string
	args []string
	env  []string
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func runService(t *testing.T, env []string, name string, args ...string) *service {
	return runCommand(t, env, name, append([]string{"run"}, args...)...)
}

// runCommand starts `surge ARGS...` as a process named name.
func runCommand(t *testing.T, env []string, name string, args ...string) *service {
	s := &service{t: t, name: name, args: args, env: env, log: &bytes.Buffer{}, mu: &sync.Mutex{}}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			s.mu.Lock()
			t.Logf("--- %s log:\n%s", s.name, s.log.String())
			s.mu.Unlock()
		}
	})
	return s
}

func (s *service) start() {
	s.t.Helper()
	s.cmd = exec.Command(binary(s.t), append(s.args, "--metrics.addr=")...)
	s.cmd.Env = append(os.Environ(), s.env...)
	w := lockedWriter{s.mu, s.log}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
}

// kill sends SIGKILL: no shutdown, no commit, no leaving the group.
func (s *service) kill() {
	if s.cmd != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait() // an error when a test waited for it already
	}
}

// The push services run as separate processes (presence, two planners,
// two executors, the offline queues), fed only through topics. In the
// middle of a job an executor and the active planner are killed with -9
// and restarted: every targeted user gets exactly one message (online at
// once, offline on their next login), nobody outside the target gets any,
// and bad records on every input topic are dead-lettered with a reason.
func TestPushServicesSurviveKill9(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns, dir := streamstest.Unique("svc")+".", t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cl := streamstest.Client(t, b.Kafka, kgo.ProducerBatchMaxBytes(1<<20))
		if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, push.Topics(ns)...); err != nil {
			t.Fatal(err)
		}
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_PUSH_NAMESPACE=" + ns,
			"SURGE_PUSH_UNIT_SIZE=500", "SURGE_PUSH_MAX_BACKLOG=3", "SURGE_LOG_LEVEL=info"}
		in := func(name string) string { return "--push.dir=" + filepath.Join(dir, name) }

		// The directory and the users, as a platform publishes them.
		const users = 60000
		var recs []*kgo.Record
		recs = append(recs, directory.AccountRecord(ns, &pb.AccountInfo{AccountId: 1, Type: "subscription",
			Filters: proto.Uint32(uint32(1 | 2)), Followers: users})) // relation and blacklist
		target, online := roaring.New(), roaring.New()
		for u := uint32(1); u <= users; u++ {
			if u%10 == 0 {
				continue // not a follower
			}
			recs = append(recs, directory.FollowRecord(ns, 1, u, true))
			target.Add(u)
		}
		for _, u := range []uint32{7, 8, 9} {
			recs = append(recs, directory.BlacklistRecord(ns, 1, u, false))
			target.Remove(u)
		}
		for u := uint32(1); u <= users; u++ {
			if u%3 != 0 {
				online.Add(u)
				r, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
				recs = append(recs, r)
			}
		}
		// Bad records on every input topic.
		bad := map[string]*kgo.Record{}
		for _, topic := range []string{schemas.TopicAccounts, schemas.TopicFanDelta, schemas.TopicTags,
			schemas.TopicBlacklists, schemas.TopicJobs, schemas.TopicLogin} {
			bad[ns+topic] = &kgo.Record{Topic: ns + topic, Key: []byte("garbage"), Value: []byte("\xff\xfe not protobuf")}
			recs = append(recs, bad[ns+topic])
		}
		outOfRange, _ := streams.NewRecord(ns+schemas.TopicFanDelta, []byte("1/x"), &pb.FanDelta{AccountId: 1, Uin: 1 << 33, Op: pb.FanDelta_FOLLOW})
		recs = append(recs, outOfRange)
		streamstest.ProduceSync(t, cl, recs...)

		runService(t, env, "presence", "push-presence", "--processor.instance_id=pres", in("pres"))
		planners := map[string]*service{
			"pa": runService(t, env, "planner-a", "push-planner", "--processor.instance_id=pa", in("pa")),
			"pb": runService(t, env, "planner-b", "push-planner", "--processor.instance_id=pb", in("pb")),
		}
		exA := runService(t, env, "executor-a", "push-executor", "--push.executor_name=ea", in("ea"))
		runService(t, env, "executor-b", "push-executor", "--push.executor_name=eb", in("eb"))
		runService(t, env, "offline", "push-offline", "--processor.instance_id=off", in("off"))

		if err := streams.WaitConsumed(ctx, b.Kafka, push.PlannerGroup(ns), directory.New(ns).Topics()...); err != nil {
			t.Fatal(err)
		}
		if err := streams.WaitConsumed(ctx, b.Kafka, ns+"presence", ns+schemas.TopicLogin); err != nil {
			t.Fatal(err)
		}
		// A package upload on push.packages, bigger than one chunk, names
		// every uin 1..users; the relation filter keeps the followers.
		pkg := roaring.New()
		pkg.AddRange(1, users+1)
		for u := uint32(users + 1); u < users+600000; u += 3 {
			pkg.Add(u * 7) // sparse non-followers: a package of several chunks
		}
		data, err := numpkg.Encode(pkg)
		if err != nil {
			t.Fatal(err)
		}
		chunks := numpkg.Chunks(ns+schemas.TopicPackages, "upload-1", data)
		if len(chunks) < 2 {
			t.Fatalf("package of %d bytes is one chunk; the test wants several", len(data))
		}
		streamstest.ProduceSync(t, cl, chunks...)
		job := &pb.SendJob{JobId: "j1", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c1", ContentCrc: 1,
			PackageUri: numpkg.TopicURI(ns+schemas.TopicPackages, "upload-1")}
		jr, _ := streams.NewRecord(ns+schemas.TopicJobs, []byte(job.JobId), job)
		streamstest.ProduceSync(t, cl, jr)

		// Kill -9 an executor and the active planner once sending began.
		waitFor(t, ctx, "first delivery", func() bool { return reportsOf(t, ns, b.Kafka, "j1").reached.GetCardinality() > 0 })
		exA.kill()
		active := activePlanner(t, ctx, b.Kafka, ns, planners)
		active.kill()
		time.Sleep(500 * time.Millisecond)
		exA.start()
		active.start()

		waitFor(t, ctx, "job completed", func() bool { return stateOf(t, b.Kafka, ns, "j1") == pb.JobState_COMPLETED })
		// The offline third logs in: each gets the message once, on login.
		offlineTargets := roaring.AndNot(target, online)
		recs = recs[:0]
		it := offlineTargets.Iterator()
		for it.HasNext() {
			u := it.Next()
			r, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
			recs = append(recs, r)
		}
		streamstest.ProduceSync(t, cl, recs...)
		waitFor(t, ctx, "deliveries on login", func() bool {
			return reportsOf(t, ns, b.Kafka, "j1").reached.GetCardinality() >= target.GetCardinality()
		})
		time.Sleep(time.Second) // anything sent twice would have arrived by now
		r := reportsOf(t, ns, b.Kafka, "j1")
		if r.twice != 0 {
			t.Fatalf("%d messages delivered twice", r.twice)
		}
		if !r.reached.Equals(target) {
			t.Fatalf("reached %d users, want the %d targets (outside the target: %d, missed: %d)", r.reached.GetCardinality(),
				target.GetCardinality(), roaring.AndNot(r.reached, target).GetCardinality(), roaring.AndNot(target, r.reached).GetCardinality())
		}
		if !r.onLogin.Equals(offlineTargets) {
			t.Fatalf("delivered on login to %d users, want the %d offline targets", r.onLogin.GetCardinality(), offlineTargets.GetCardinality())
		}

		// Every bad record is in the dead-letter topic, with a reason.
		reasons := map[string]string{}
		err = streams.ReadToEnd(ctx, b.Kafka, ns+schemas.TopicDeadLetter, func(r *kgo.Record) error {
			from, _ := streams.Header(r, streams.HeaderDLQTopic)
			why, _ := streams.Header(r, streams.HeaderDLQReason)
			if string(r.Key) == "garbage" || string(r.Key) == "1/x" {
				reasons[from+"|"+string(r.Key)] = why
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for topic := range bad {
			if reasons[topic+"|garbage"] == "" {
				t.Errorf("bad record on %s not dead-lettered with a reason (have %v)", topic, reasons)
			}
		}
		if why := reasons[ns+schemas.TopicFanDelta+"|1/x"]; !strings.Contains(why, "32-bit") {
			t.Errorf("out-of-range uin on push.fan-delta: reason %q", why)
		}
	})
}

type jobReports struct {
	reached, onLogin *roaring.Bitmap
	twice            uint64
}

func reportsOf(t *testing.T, ns string, kc streams.Cluster, jobID string) jobReports {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := jobReports{reached: roaring.New(), onLogin: roaring.New()}
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicReports, func(r *kgo.Record) error {
		var rep pb.DeliveryReport
		if streams.Decode(r, &rep) != nil || rep.JobId != jobID {
			return nil
		}
		set, err := reportedUins(&rep)
		if err != nil {
			return err
		}
		switch rep.Status {
		case pb.DeliveryStatus_DELIVERED_ON_LOGIN:
			out.onLogin.Or(set)
		case pb.DeliveryStatus_DELIVERED:
		default:
			return nil
		}
		out.twice += out.reached.AndCardinality(set)
		out.reached.Or(set)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// reportedUins are the users a delivery report names: its bitmap, or its
// one uin.
func reportedUins(rep *pb.DeliveryReport) (*roaring.Bitmap, error) {
	set := roaring.New()
	if len(rep.Uins) > 0 {
		return set, set.UnmarshalBinary(rep.Uins)
	}
	set.Add(uint32(rep.Uin))
	return set, nil
}

func stateOf(t *testing.T, kc streams.Cluster, ns, jobID string) pb.JobState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st pb.JobState
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicJobTransitions, func(r *kgo.Record) error {
		var tr pb.JobTransition
		if streams.Decode(r, &tr) == nil && tr.JobId == jobID {
			st = tr.To
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// activePlanner finds the planner that holds the group's partitions, by
// the group's description (a member's client id ends in its instance id).
func activePlanner(t *testing.T, ctx context.Context, kc streams.Cluster, ns string, planners map[string]*service) *service {
	t.Helper()
	cl := streamstest.Client(t, kc)
	adm := kadm.NewClient(cl)
	var active *service
	waitFor(t, ctx, "an active planner", func() bool {
		groups, err := adm.DescribeGroups(ctx, push.PlannerGroup(ns))
		if err != nil {
			return false
		}
		for _, m := range groups[push.PlannerGroup(ns)].Members {
			if a, ok := m.Assigned.AsConsumer(); ok && len(a.Topics) > 0 {
				for id, p := range planners {
					if strings.HasSuffix(m.ClientID, "-"+id) {
						active = p
						return true
					}
				}
			}
		}
		return false
	})
	return active
}

func waitFor(t *testing.T, ctx context.Context, what string, ok func() bool) {
	t.Helper()
	for !ok() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
