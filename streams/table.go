package streams

import (
	"context"
	"maps"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Table follows a topic from its start (or from a checkpoint's offsets),
// on every partition and outside any group: a local copy of a (usually
// compacted) topic that every instance holds whole, like a Kafka Streams
// global table. Ready closes once the copy has caught up with the end
// offsets seen at start.
type Table struct {
	topic string
	cl    *kgo.Client
	apply func(*kgo.Record)
	ready chan struct{}
	o     tableOptions
	next  map[int32]int64 // the next offset to apply, per partition
}

type tableOptions struct {
	from       map[int32]int64
	every      time.Duration
	checkpoint func(next map[int32]int64)
}

// TableOption configures FollowTable.
type TableOption func(*tableOptions)

// TableFrom starts the partitions named at the given offsets (the next
// offset to apply, as a checkpoint saved them); the others from the start.
func TableFrom(next map[int32]int64) TableOption {
	return func(o *tableOptions) { o.from = next }
}

// TableCheckpoint calls fn every period with the next offset of each
// partition, on the goroutine that applies records: whatever fn saves of
// the applied state is consistent with those offsets, and a later
// FollowTable with TableFrom(them) goes on from there.
func TableCheckpoint(period time.Duration, fn func(next map[int32]int64)) TableOption {
	return func(o *tableOptions) { o.every, o.checkpoint = period, fn }
}

// FollowTable starts following topic; apply runs on one goroutine, in
// partition order. It runs until ctx ends.
func FollowTable(ctx context.Context, cluster Cluster, topic string, apply func(*kgo.Record), opts ...TableOption) (*Table, error) {
	var o tableOptions
	for _, f := range opts {
		f(&o)
	}
	probe, err := cluster.NewClient()
	if err != nil {
		return nil, err
	}
	ends, err := EndOffsets(ctx, probe, topic)
	probe.Close()
	if err != nil {
		return nil, err
	}
	start := map[string]map[int32]kgo.Offset{topic: {}}
	next := map[int32]int64{}
	cu := NewCatchUp(ends)
	for p, off := range o.from {
		next[p] = off
		start[topic][p] = kgo.NewOffset().At(off)
		cu.From(p, off)
		if off >= ends[p] {
			delete(cu.ends, p) // nothing new since the checkpoint
		}
	}
	copts := cluster.Opts(kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if len(o.from) > 0 {
		// Every partition explicitly: the checkpointed ones at their
		// offsets, the rest (new or empty then) from the start.
		all, err := partitionsOf(ctx, cluster, topic)
		if err != nil {
			return nil, err
		}
		for _, p := range all {
			if _, ok := start[topic][p]; !ok {
				start[topic][p] = kgo.NewOffset().AtStart()
			}
		}
		copts = append(copts, kgo.ConsumePartitions(start))
	} else {
		copts = append(copts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	}
	cl, err := kgo.NewClient(copts...)
	if err != nil {
		return nil, err
	}
	t := &Table{topic: topic, cl: cl, apply: apply, ready: make(chan struct{}), o: o, next: next}
	go t.run(ctx, cu)
	return t, nil
}

// partitionsOf lists the partitions of topic.
func partitionsOf(ctx context.Context, cluster Cluster, topic string) ([]int32, error) {
	cl, err := cluster.NewClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return nil, err
	}
	var ps []int32
	for p := range td[topic].Partitions {
		ps = append(ps, p)
	}
	return ps, nil
}

// Ready is closed when the table has caught up.
func (t *Table) Ready() <-chan struct{} { return t.ready }

func (t *Table) run(ctx context.Context, cu *CatchUp) {
	defer t.cl.Close()
	ready := false
	last := time.Now()
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
			t.next[r.Partition] = r.Offset + 1
		})
		cu.Polled(fs.NumRecords())
		if ready && t.o.checkpoint != nil && time.Since(last) >= t.o.every {
			t.o.checkpoint(maps.Clone(t.next))
			last = time.Now()
		}
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
