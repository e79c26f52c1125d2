package streams

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition assigned again while its rebuild runs stays stale: the
// rebuild may have read the changelog before the other owner's last
// writes, so the next Ensure rebuilds it once more.
func TestRestorerReassignedDuringRebuild(t *testing.T) {
	const topic = "changelog"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clears := 0
	var r *Restorer
	r = NewRestorer(c.ListenAddrs(), func(map[int32]bool) error {
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
