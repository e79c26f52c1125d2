package app_test

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/app"
	"surge/processors/push/filter"
	"surge/processors/push/planner"
	"surge/processors/push/recovery"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"

	"surge/processors/push/directory"

	"google.golang.org/protobuf/proto"
)

const (
	crashUsers = 60_000
	crashUnit  = 1000
)

func crashConfig() planner.Config {
	c := planner.DefaultConfig()
	c.UnitSize, c.MaxBacklog = crashUnit, 2
	return c
}

// TestCrashChild is the process the crash tests kill: the whole push stack.
func TestCrashChild(t *testing.T) {
	ns := os.Getenv("SURGE_PUSH_CHILD_NS")
	if ns == "" {
		t.Skip("run by the crash tests")
	}
	kc := streams.Seeds(strings.Split(os.Getenv("SURGE_PUSH_CHILD_BROKERS"), ",")...)
	s := app.New(kc, app.Options{Namespace: ns, Dir: os.Getenv("SURGE_PUSH_CHILD_DIR"), Executors: 2,
		Planner: crashConfig(), Log: quiet(),
		// A killed member holds its partitions until its session times
		// out; keep that short so restarts resume quickly. On kfake a
		// restart also waited out the rebalance timeout (60 s by
		// default), so that is short too. Each processor joins as a
		// static member (processor.static_membership), as an operator
		// restarting an instance in place would run it: the restarted
		// member takes the killed one's place at once. Without it, kfake
		// sometimes kept the killed planner in the group for good, holding
		// every partition, and the job never resumed.
		StreamOpts: []streams.Option{streams.InstanceID("crash-child"), streams.StaticMembership(),
			streams.ClientOpts(kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second),
				kgo.HeartbeatInterval(500*time.Millisecond))}})
	publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.CRC))}))
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_ = s.Wait()
}

type child struct {
	t   *testing.T
	cmd *exec.Cmd
}

func spawn(t *testing.T, kc streams.Cluster, ns, dir string) *child {
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SURGE_PUSH_CHILD_NS="+ns, "SURGE_PUSH_CHILD_DIR="+dir,
		"SURGE_PUSH_CHILD_BROKERS="+strings.Join(kc.Seeds, ","))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: cmd}
	t.Cleanup(c.kill)
	return c
}

func (c *child) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill() // SIGKILL: no shutdown, no commit
		_ = c.cmd.Wait()
	}
}

// crashSetup creates the topics, sets two thirds of the users online and
// returns the job's package.
func crashSetup(t *testing.T, b streamstest.Backend, ns string) (*kgo.Client, *roaring.Bitmap, *roaring.Bitmap) {
	s := app.New(b.Kafka, app.Options{Namespace: ns, Dir: t.TempDir()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.CreateTopics(ctx, streams.OneCopy); err != nil {
		t.Fatal(err)
	}
	cl := streamstest.Client(t, b.Kafka)
	e := &env{t: t, ns: ns, b: b, cl: cl}
	pkg, online := roaring.New(), roaring.New()
	pkg.AddRange(1, crashUsers+1)
	for u := uint32(1); u <= crashUsers; u++ {
		if u%3 != 0 {
			online.Add(u)
		}
	}
	e.logins(true, online.ToArray()...)
	// The presence processor of the stack under test turns these into
	// push.presence; a stack started now must see them all before the job.
	return cl, pkg, online
}

// startChild spawns the stack and waits until its presence processor has
// published every login, so executors see the users online.
func startChild(t *testing.T, b streamstest.Backend, ns, dir string, online uint64) *child {
	c := spawn(t, b.Kafka, ns, dir)
	recs := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicPresence, true, int(online), 90*time.Second, 0)
	if uint64(len(recs)) < online {
		t.Fatalf("presence published %d of %d logins", len(recs), online)
	}
	return c
}

func submitTo(t *testing.T, cl *kgo.Client, ns string, j *pb.SendJob) {
	r, err := streams.NewRecord(ns+schemas.TopicJobs, []byte(j.JobId), j)
	if err != nil {
		t.Fatal(err)
	}
	streamstest.ProduceSync(t, cl, r)
}

// completed reports whether the job's COMPLETED transition is committed.
func completed(t *testing.T, kc streams.Cluster, ns, id string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := false
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicJobTransitions, func(r *kgo.Record) error {
		var tr pb.JobTransition
		if streams.Decode(r, &tr) == nil && tr.JobId == id && tr.To == pb.JobState_COMPLETED {
			done = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return done
}

// offlineQueued reads the committed offline batches of a job: each uin
// must be queued once.
func offlineQueued(t *testing.T, kc streams.Cluster, ns, id string) *roaring.Bitmap {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := roaring.New()
	err := streams.ReadToEnd(ctx, kc, ns+schemas.TopicOffline, func(r *kgo.Record) error {
		var ob pb.OfflineBatch
		if streams.Decode(r, &ob) != nil || ob.JobId != id {
			return nil
		}
		set := roaring.New()
		if err := set.UnmarshalBinary(ob.Uins); err != nil {
			t.Fatal(err)
		}
		if n := out.AndCardinality(set); n != 0 {
			t.Fatalf("%d users queued offline twice", n)
		}
		out.Or(set)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func delivered(t *testing.T, kc streams.Cluster, ns, id string) *recovery.Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o, err := recovery.Read(ctx, kc, ns, id)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// A push stack is SIGKILLed three times in the middle of a job and
// restarted: the job resumes where it was, and no user is sent to twice
// nor missed.
func TestCrashResumeNoResend(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns, dir := streamstest.Unique("crash")+".", t.TempDir()
		cl, pkg, online := crashSetup(t, b, ns)
		c := startChild(t, b, ns, dir, online.GetCardinality())
		submitTo(t, cl, ns, &pb.SendJob{JobId: "big", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c",
			ContentCrc: 9, InlinePackage: inline(t, pkg)})
		var last uint64
		for kill := 1; kill <= 3; kill++ {
			// Generous: a restart on a loaded 2-core CI machine waits out a
			// session timeout and restores; speed is measured in bench/, not here.
			deadline := time.Now().Add(3 * time.Minute)
			for {
				n := delivered(t, b.Kafka, ns, "big").Delivered.GetCardinality()
				if n > last {
					last = n
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no progress before kill %d (delivered %d)", kill, n)
				}
				time.Sleep(50 * time.Millisecond)
			}
			c.kill()
			if completed(t, b.Kafka, ns, "big") {
				t.Fatalf("the job finished before kill %d; the test needs a slower job", kill)
			}
			t.Logf("kill %d: %d of %d online users delivered", kill, last, online.GetCardinality())
			c = spawn(t, b.Kafka, ns, dir)
		}
		deadline := time.Now().Add(3 * time.Minute)
		for !completed(t, b.Kafka, ns, "big") {
			if time.Now().After(deadline) {
				t.Fatal("job did not complete after the restarts")
			}
			time.Sleep(200 * time.Millisecond)
		}
		o := delivered(t, b.Kafka, ns, "big")
		if o.Duplicate != 0 {
			t.Fatalf("%d users delivered twice", o.Duplicate)
		}
		if !o.Delivered.Equals(online) {
			t.Fatalf("delivered %d users, online targets %d", o.Delivered.GetCardinality(), online.GetCardinality())
		}
		offline := roaring.AndNot(pkg, online)
		if q := offlineQueued(t, b.Kafka, ns, "big"); !q.Equals(offline) {
			t.Fatalf("queued offline %d, want %d", q.GetCardinality(), offline.GetCardinality())
		}
	})
}

// Site A dies mid-job for good. Site B rebuilds the remaining work from the
// package and A's report topic, and sends exactly the rest.
func TestSecondSiteSendsTheRest(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		nsA := streamstest.Unique("siteA") + "."
		cl, pkg, online := crashSetup(t, b, nsA)
		c := startChild(t, b, nsA, t.TempDir(), online.GetCardinality())
		submitTo(t, cl, nsA, &pb.SendJob{JobId: "big", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c",
			ContentCrc: 9, InlinePackage: inline(t, pkg)})
		deadline := time.Now().Add(90 * time.Second)
		for delivered(t, b.Kafka, nsA, "big").Delivered.GetCardinality() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("site A made no progress")
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.kill()
		if completed(t, b.Kafka, nsA, "big") {
			t.Fatal("site A finished; the test needs it to die mid-job")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rest, a, err := recovery.Remaining(ctx, b.Kafka, nsA, "big", pkg)
		if err != nil {
			t.Fatal(err)
		}
		if rest.IsEmpty() || rest.GetCardinality() == pkg.GetCardinality() {
			t.Fatalf("remaining %d of %d: not a mid-job state", rest.GetCardinality(), pkg.GetCardinality())
		}
		t.Logf("site A delivered %d; site B takes the remaining %d", a.Delivered.GetCardinality(), rest.GetCardinality())

		// Site B: its own stack and topics; the users' presence replicated.
		e := start(t, b, testConfig(), func(s *app.Stack) {
			publish(t, s, directory.AccountRecord(s.Opts.Namespace, &pb.AccountInfo{AccountId: 1, Filters: proto.Uint32(uint32(filter.CRC))}))
		})
		e.logins(true, online.ToArray()...)
		e.waitOnline(online.GetCardinality())
		e.submit(&pb.SendJob{JobId: "big", AccountId: 1, Source: pb.TargetSource_PACKAGE, ContentId: "c",
			ContentCrc: 9, InlinePackage: inline(t, rest)})
		e.waitState("big", pb.JobState_COMPLETED)
		bo := e.outcome("big")
		if n := a.Delivered.AndCardinality(bo.Delivered); n != 0 {
			t.Fatalf("%d users delivered by both sites", n)
		}
		all := roaring.Or(a.Delivered, bo.Delivered)
		if !all.Equals(online) {
			t.Fatalf("the sites together delivered %d, online targets %d", all.GetCardinality(), online.GetCardinality())
		}
		if q := offlineQueued(t, b.Kafka, e.ns, "big"); !q.Equals(roaring.AndNot(pkg, online)) {
			t.Fatalf("site B queued %d offline, want %d", q.GetCardinality(), roaring.AndNot(pkg, online).GetCardinality())
		}
	})
}
