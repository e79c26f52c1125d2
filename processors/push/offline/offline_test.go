package offline_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/offline"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// instance is one running offline processor on its store directory.
type instance struct {
	q    *offline.Queues
	stop func()
}

func start(t *testing.T, kc streams.Cluster, ns, dir string) instance {
	t.Helper()
	q := offline.New(offline.Config{Env: streams.Env{Kafka: kc, Namespace: ns, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, Dir: dir})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx, streams.MaxBatch(100)) }()
	return instance{q: q, stop: func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("offline: %v", err)
		}
	}}
}

// Restarted in place, the queues use their store as it is (no rebuild
// from the topics); after another instance consumed their partitions
// meanwhile, they rebuild. Either way every queued message is delivered
// exactly once, on its user's first login, and never again.
func TestRestartKeepsTheStoreWhenCurrent(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns := streamstest.Unique("offq") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, ns+schemas.TopicOffline, ns+schemas.TopicLogin, ns+schemas.TopicPresence,
			ns+schemas.TopicReports, ns+schemas.TopicDeadLetter)
		cl := streamstest.Client(t, b.Kafka)
		produce := func(topic string, uin uint32, m proto.Message) {
			t.Helper()
			r, err := streams.NewRecord(ns+topic, schemas.UinKey(uin), m)
			if err != nil {
				t.Fatal(err)
			}
			streamstest.ProduceSync(t, cl, r)
		}
		login := func(uin uint32) {
			produce(schemas.TopicLogin, uin, &pb.LoginEvent{Uin: uint64(uin), Online: true, AtMs: time.Now().UnixMilli()})
		}
		// Deliveries so far, as "job/uin", sorted, duplicates kept.
		delivered := func(want int) []string {
			t.Helper()
			var out []string
			for _, r := range streamstest.ReadN(t, b.Kafka, ns+schemas.TopicReports, true, want, 30*time.Second, time.Second) {
				var rep pb.DeliveryReport
				if err := streams.Decode(r, &rep); err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("%s/%d", rep.JobId, rep.Uin))
			}
			sort.Strings(out)
			return out
		}
		expect := func(want ...string) {
			t.Helper()
			if got := delivered(len(want)); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("delivered %v, want %v", got, want)
			}
		}
		waitQueued := func(q *offline.Queues, uin uint32, want int) {
			t.Helper()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if p, err := q.Pending(uin); err == nil && len(p) == want {
					return
				}
				if time.Now().After(deadline) {
					p, err := q.Pending(uin)
					t.Fatalf("uin %d: pending %v (%v), want %d", uin, p, err, want)
				}
			}
		}

		dir := t.TempDir()
		a := start(t, b.Kafka, ns, dir)
		for uin := uint32(1); uin <= 5; uin++ {
			set := roaring.BitmapOf(uin)
			uins, _ := set.ToBytes()
			produce(schemas.TopicOffline, uin, &pb.OfflineBatch{JobId: "j1", Uins: uins, ContentId: "c", AtMs: time.Now().UnixMilli()})
		}
		waitQueued(a.q, 5, 1)
		login(1)
		expect("j1/1")
		a.stop()

		// In place: the store is current, nothing is read back.
		a = start(t, b.Kafka, ns, dir)
		login(2)
		login(1) // again: already delivered
		expect("j1/1", "j1/2")
		if n := a.q.Rebuilds.Load(); n != 0 {
			t.Fatalf("restart in place rebuilt the store %d times", n)
		}
		if p, _ := a.q.Pending(3); len(p) != 1 {
			t.Fatalf("uin 3: pending %v after the restart", p)
		}
		a.stop()

		// Another instance consumes the partitions meanwhile.
		other := start(t, b.Kafka, ns, t.TempDir())
		login(3)
		expect("j1/1", "j1/2", "j1/3")
		other.stop()

		// Back on the first store: it is behind the group, so rebuilt.
		a = start(t, b.Kafka, ns, dir)
		login(4)
		login(3) // delivered by the other instance: not again
		expect("j1/1", "j1/2", "j1/3", "j1/4")
		if n := a.q.Rebuilds.Load(); n != 1 {
			t.Fatalf("a store behind the group was rebuilt %d times, want 1", n)
		}
		waitQueued(a.q, 5, 1)
		a.stop()
	})
}
