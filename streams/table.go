package streams

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Table follows a topic from its start, on every partition and outside any
// group: a local copy of a (usually compacted) topic that every instance
// holds whole, like a Kafka Streams global table. Ready closes once the
// copy has caught up with the end offsets seen at start.
type Table struct {
	topic string
	cl    *kgo.Client
	apply func(*kgo.Record)
	ready chan struct{}
}

// FollowTable starts following topic; apply runs on one goroutine, in
// partition order. It runs until ctx ends.
func FollowTable(ctx context.Context, brokers []string, topic string, apply func(*kgo.Record)) (*Table, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return nil, err
	}
	t := &Table{topic: topic, cl: cl, apply: apply, ready: make(chan struct{})}
	ends, err := EndOffsets(ctx, cl, topic)
	if err != nil {
		cl.Close()
		return nil, err
	}
	go t.run(ctx, ends)
	return t, nil
}

// Ready is closed when the table has caught up.
func (t *Table) Ready() <-chan struct{} { return t.ready }

func (t *Table) run(ctx context.Context, ends map[int32]int64) {
	defer t.cl.Close()
	cu := NewCatchUp(ends)
	ready := false
	for ctx.Err() == nil {
		if !ready && cu.Done() {
			close(t.ready)
			ready = true
		}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		fs := t.cl.PollRecords(pctx, 10000)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			t.apply(r)
			cu.Saw(r)
		})
		cu.Polled(fs.NumRecords())
	}
}

// EndOffsets lists the end offset of each non-empty partition of topic,
// retrying for ten seconds while the topic is not yet known.
func EndOffsets(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	adm := kadm.NewClient(cl)
	var listed kadm.ListedOffsets
	err := retryFor(ctx, 10*time.Second, func() error {
		var err error
		if listed, err = adm.ListEndOffsets(ctx, topic); err == nil {
			err = listed.Error()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			ends[o.Partition] = o.Offset
		}
	})
	return ends, nil
}

// retryFor retries fn every 200 ms until it succeeds or d passes.
func retryFor(ctx context.Context, d time.Duration, fn func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
