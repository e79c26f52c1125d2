package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	push "surge/processors/push/app"
	"surge/processors/push/directory"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// pushBed is a push namespace on a broker, with its topics, for services
// run as processes: the environment they share and a directory each.
type pushBed struct {
	t   *testing.T
	b   streamstest.Backend
	ns  string
	dir string
	cl  *kgo.Client
	env []string
	// presence: a presence service runs in the bed; executors then start
	// once it has applied the logins published so far.
	presence bool
}

// newPushBed makes the namespace's topics (one copy each); env is added
// to the services'.
func newPushBed(t *testing.T, ctx context.Context, b streamstest.Backend, name string, env ...string) *pushBed {
	t.Helper()
	return newPushBedReplicated(t, ctx, b, streams.OneCopy, name, env...)
}

// newPushBedReplicated is newPushBed with topics of replication rep.
func newPushBedReplicated(t *testing.T, ctx context.Context, b streamstest.Backend, rep streams.Replication, name string, env ...string) *pushBed {
	t.Helper()
	p := &pushBed{t: t, b: b, ns: streamstest.Unique(name) + ".", dir: t.TempDir(),
		cl: streamstest.Client(t, b.Kafka, kgo.ProducerBatchMaxBytes(1<<20))}
	if err := streams.EnsureTopics(ctx, p.cl, rep, push.Topics(p.ns)...); err != nil {
		t.Fatal(err)
	}
	p.env = append([]string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_PUSH_NAMESPACE=" + p.ns}, env...)
	return p
}

// in is the --push.dir flag of the service called name.
func (p *pushBed) in(name string) string { return "--push.dir=" + p.dir + "/" + name }

// run starts `surge run` component as a process named name. An executor
// starts once the bed's presence has applied every login published so
// far: it loads its online bitmap from push.presence at start and then
// follows it, with no offset a test can wait on, so a job sent right after
// could find a follower not yet online there (CI saw 742 of 20,000 queued
// offline that way).
func (p *pushBed) run(name, component string, args ...string) *service {
	p.t.Helper()
	switch component {
	case "push-presence":
		p.presence = true
	case "push-executor":
		if p.presence {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := streams.WaitConsumed(ctx, p.b.Kafka, p.ns+"presence", p.ns+schemas.TopicLogin); err != nil {
				p.t.Fatalf("presence never applied the logins: %v", err)
			}
		}
	}
	return runService(p.t, p.env, name, append([]string{component, p.in(name)}, args...)...)
}

// onlineFollowers publishes account 1 (relation filter only) with
// followers 1..users, all logged in; it returns them.
func (p *pushBed) onlineFollowers(users uint32) *roaring.Bitmap {
	p.t.Helper()
	recs := []*kgo.Record{directory.AccountRecord(p.ns, &pb.AccountInfo{AccountId: 1, Type: "subscription",
		Filters: proto.Uint32(1), Followers: uint64(users)})}
	target := roaring.New()
	target.AddRange(1, uint64(users)+1)
	for u := uint32(1); u <= users; u++ {
		recs = append(recs, directory.FollowRecord(p.ns, 1, u, true))
		r, _ := streams.NewRecord(p.ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
		recs = append(recs, r)
	}
	streamstest.ProduceSync(p.t, p.cl, recs...)
	return target
}

// ready waits until the planners have read the directory, presence the
// logins, and every executor named reports on push.executors.
func (p *pushBed) ready(ctx context.Context, executors ...string) {
	p.t.Helper()
	if err := streams.WaitConsumed(ctx, p.b.Kafka, push.PlannerGroup(p.ns), directory.New(p.ns).Topics()...); err != nil {
		p.t.Fatal(err)
	}
	if err := streams.WaitConsumed(ctx, p.b.Kafka, p.ns+"presence", p.ns+schemas.TopicLogin); err != nil {
		p.t.Fatal(err)
	}
	waitFor(p.t, ctx, "every executor reporting", func() bool {
		seen := map[string]bool{}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = streams.ReadToEnd(rctx, p.b.Kafka, p.ns+schemas.TopicExecutors, func(r *kgo.Record) error {
			var l pb.ExecutorLoad
			if streams.Decode(r, &l) == nil {
				seen[l.Executor] = true
			}
			return nil
		})
		for _, x := range executors {
			if !seen[x] {
				return false
			}
		}
		return true
	})
}
