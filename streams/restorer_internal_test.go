package streams

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// topic is the changelog the Restorer tests rebuild from.
const topic = "changelog"

// changelogCluster is a kfake broker holding topic in partitions
// partitions, closed when the test ends.
func changelogCluster(t *testing.T, partitions int32) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// A partition assigned again while its rebuild runs stays stale: the
// rebuild may have read the changelog before the other owner's last
// writes, so the next Ensure rebuilds it once more.
func TestRestorerReassignedDuringRebuild(t *testing.T) {
	c := changelogCluster(t, 2)
	clears := 0
	var r *Restorer
	r = NewRestorer(Seeds(c.ListenAddrs()...), func(map[int32]bool) error {
		clears++
		if clears == 1 {
			r.assigned(map[string][]int32{topic: {0}}) // revoked and assigned back mid-rebuild
		}
		return nil
	}, func(*kgo.Record) error { return nil }, topic)
	r.assigned(map[string][]int32{topic: {0}})
	ctx := context.Background()
	for i, want := range []int{1, 2, 2} {
		if err := r.Ensure(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if clears != want {
			t.Fatalf("Ensure %d: %d rebuilds, want %d", i+1, clears, want)
		}
	}
}

// After Baseline, a partition whose changelog has not grown is not
// rebuilt when assigned; one that has grown is.
func TestRestorerSkipsUnchangedSinceBaseline(t *testing.T) {
	c := changelogCluster(t, 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	produce := func(p int32) {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(0)
	produce(1)
	var cleared []map[int32]bool
	r := NewRestorer(Seeds(c.ListenAddrs()...), func(ps map[int32]bool) error {
		cleared = append(cleared, ps)
		return nil
	}, func(*kgo.Record) error { return nil }, topic)
	if err := r.Baseline(ctx); err != nil {
		t.Fatal(err)
	}
	r.assigned(map[string][]int32{topic: {0, 1}})
	if err := r.Ensure(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if len(cleared) != 0 {
		t.Fatalf("unchanged partitions rebuilt: %v", cleared)
	}
	produce(1) // another owner wrote to partition 1
	r.assigned(map[string][]int32{topic: {0, 1}})
	if err := r.Ensure(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if len(cleared) != 1 || !cleared[0][1] || cleared[0][0] {
		t.Fatalf("rebuilt %v, want partition 1 only", cleared)
	}
}

// EnsureAll makes every owned partition current, traffic or not; a
// revoked partition is no longer current and is not rebuilt until it is
// assigned again.
// ... and readiness follows: not ready while an owned partition is stale.
func TestRestorerEnsureAllAndRevocation(t *testing.T) {
	c := changelogCluster(t, 3)
	var rebuilt []map[int32]bool
	r := NewRestorer(Seeds(c.ListenAddrs()...), func(ps map[int32]bool) error {
		rebuilt = append(rebuilt, ps)
		return nil
	}, func(*kgo.Record) error { return nil }, topic)
	ctx := context.Background()
	r.assigned(map[string][]int32{topic: {0, 1}})
	if r.Current(0) || r.Current(1) {
		t.Fatal("assigned partitions are current before their rebuild")
	}
	if err := r.EnsureAll(ctx); err != nil {
		t.Fatal(err)
	}
	if !r.Current(0) || !r.Current(1) || r.Current(2) || len(rebuilt) != 1 || len(rebuilt[0]) != 2 {
		t.Fatalf("after EnsureAll: current %v %v %v, rebuilds %v", r.Current(0), r.Current(1), r.Current(2), rebuilt)
	}
	if err := r.restored(); err != nil {
		t.Fatalf("every owned partition rebuilt, yet not ready: %v", err)
	}
	r.revoked(map[string][]int32{topic: {1}})
	if r.Current(1) || !r.Current(0) {
		t.Fatal("a revoked partition is still current, or another lost its state")
	}
	r.assigned(map[string][]int32{topic: {1}})
	if err := r.restored(); err == nil || !strings.Contains(err.Error(), "restoring partitions [1]") {
		t.Fatalf("a partition assigned and not yet rebuilt: readiness %v", err)
	}
	if err := r.EnsureAll(ctx); err != nil {
		t.Fatal(err)
	}
	if !r.Current(1) || len(rebuilt) != 2 || !rebuilt[1][1] || rebuilt[1][0] {
		t.Fatalf("partition 1 assigned again: rebuilds %v", rebuilt)
	}
}
