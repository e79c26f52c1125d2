package streams

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A table checkpoint's offsets, given back with TableFrom, make the next
// table read only what was published after the checkpoint: every record
// is applied once across the two, none skipped.
func TestTableCheckpointThenResume(t *testing.T) {
	c := changelogCluster(t, 3)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			k := strconv.Itoa(i)
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(k), Value: []byte(k)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(0, 300)
	var mu sync.Mutex
	seen := map[string]int{}
	apply := func(r *kgo.Record) {
		mu.Lock()
		seen[string(r.Value)]++
		mu.Unlock()
	}
	saved := make(chan map[int32]int64, 1)
	tctx, stop := context.WithCancel(ctx)
	tb, err := FollowTable(tctx, Seeds(c.ListenAddrs()...), topic, apply, TableCheckpoint(time.Millisecond, func(next map[int32]int64) {
		select {
		case saved <- next:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	<-tb.Ready()
	var next map[int32]int64
	for {
		next = <-saved
		var n int64
		for _, o := range next {
			n += o
		}
		if n == 300 {
			break
		}
	}
	stop()
	produce(300, 400)
	tb2, err := FollowTable(ctx, Seeds(c.ListenAddrs()...), topic, apply, TableFrom(next))
	if err != nil {
		t.Fatal(err)
	}
	<-tb2.Ready()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n == 400 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 400 {
		t.Fatalf("%d of 400 records applied", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("record %s applied %d times", k, n)
		}
	}
}
