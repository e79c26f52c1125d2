package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Restorer keeps a processor's local store in step with the partitions it
// owns, Kafka Streams style: the store is a cache of changelog topics
// co-partitioned with the inputs, and a partition's part of it is rebuilt
// from the changelogs whenever the partition is assigned. An instance that
// takes a partition over from another (a crash, a rebalance, a second
// instance joining) therefore never acts on the state it had before the
// other instance's writes.
//
// The rebuild is lazy: assignment only marks partitions stale, and the
// handler calls Ensure before it touches a partition's state, so the
// rebuild runs on the processing goroutine, never concurrently with it.
type Restorer struct {
	cluster Cluster
	topics  []string
	clear   func(partitions map[int32]bool) error
	apply   func(r *kgo.Record) error

	// AfterRebuild, if set, runs when a rebuild has read every changelog
	// record (a store that buffers apply's writes flushes them here).
	AfterRebuild func() error
	// AfterAssign, if set, runs after each assignment is recorded.
	AfterAssign func()

	group  string          // see InputsOf
	inputs map[string]bool // changelogs that are also the processor's inputs

	mu       sync.Mutex
	stale    map[int32]bool
	owned    map[int32]bool
	gen      map[int32]uint64           // assignments seen per partition
	baseline map[string]map[int32]int64 // see Baseline
}

// NewRestorer rebuilds with clear (drop a partition's state) then apply
// (each changelog record of it, in order), reading topics up to their last
// stable offsets.
func NewRestorer(cluster Cluster, clear func(map[int32]bool) error, apply func(*kgo.Record) error, topics ...string) *Restorer {
	return &Restorer{cluster: cluster, topics: topics, clear: clear, apply: apply, stale: map[int32]bool{}, owned: map[int32]bool{}, gen: map[int32]uint64{}}
}

// InputsOf marks changelog topics that are also inputs of the processor's
// group: their records up to the group's committed offset were applied by
// whoever owned the partition before, and the rest the processor consumes
// itself, so a rebuild reads them only that far (never twice).
func (r *Restorer) InputsOf(group string, topics ...string) *Restorer {
	r.group, r.inputs = group, map[string]bool{}
	for _, t := range topics {
		r.inputs[t] = true
	}
	return r
}

// Baseline records the changelogs' end offsets now, before the caller
// loads its whole store from them (a start-up restore). A partition whose
// changelogs still end there when it is assigned needs no rebuild: nothing
// was written to it since, by this instance or another.
func (r *Restorer) Baseline(ctx context.Context) error {
	offs, err := endOffsets(ctx, r.cluster, r.topics)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.baseline = offs
	r.mu.Unlock()
	return nil
}

// unchanged returns the partitions of ps whose changelogs all still end at
// the baseline (an empty partition ends at 0).
func (r *Restorer) unchanged(ctx context.Context, ps []int32) (map[int32]bool, error) {
	r.mu.Lock()
	base := r.baseline
	r.mu.Unlock()
	if base == nil {
		return nil, nil
	}
	cur, err := endOffsets(ctx, r.cluster, r.topics)
	if err != nil {
		return nil, err
	}
	same := map[int32]bool{}
	for _, p := range ps {
		same[p] = true
		for _, t := range r.topics {
			if base[t][p] != cur[t][p] {
				same[p] = false
			}
		}
	}
	return same, nil
}

// endOffsets is EndOffsets of each topic.
func endOffsets(ctx context.Context, cluster Cluster, topics []string) (map[string]map[int32]int64, error) {
	cl, err := cluster.NewClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	out := map[string]map[int32]int64{}
	for _, t := range topics {
		if out[t], err = EndOffsets(ctx, cl, t); err != nil {
			return nil, fmt.Errorf("restore: end offsets of %s: %w", t, err)
		}
	}
	return out, nil
}

// Option hooks the restorer into a Runner: its group membership (an
// assignment marks partitions stale), its idle time (stale partitions are
// rebuilt then, not only when a record of theirs arrives) and its
// readiness (not ready while a partition it owns is being restored).
func (r *Restorer) Option() Option {
	client := ClientOpts(
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, as map[string][]int32) { r.assigned(as) }),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, rs map[string][]int32) { r.revoked(rs) }),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, rs map[string][]int32) { r.revoked(rs) }),
	)
	// An error here is met again by the next record's Ensure, which
	// fails its batch and retries: nothing to do with it on idle.
	idle := OnIdle(func(ctx context.Context) { _ = r.EnsureAll(ctx) })
	ready := ReadyWhen(r.restored)
	return func(c *config) { client(c); idle(c); ready(c) }
}

// restored is nil once every partition this instance owns is current.
func (r *Restorer) restored() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []int32
	for p, s := range r.stale {
		if s && r.owned[p] {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return nil
	}
	slices.Sort(ps)
	return fmt.Errorf("restoring partitions %v of %s", ps, strings.Join(r.topics, ", "))
}

// revoked forgets partitions this instance no longer owns: their state
// here is no longer kept current. Inside a transactional session the
// callback may not run (kgo skips it while a revocation is pending), so
// owning is only a hint: a caller that must know asks the group.
func (r *Restorer) revoked(rs map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ps := range rs {
		for _, p := range ps {
			r.owned[p] = false
		}
	}
}

// Current reports whether this instance owns partition p and its state is
// rebuilt: reads of p's state are then the truth.
func (r *Restorer) Current(p int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.owned[p] && !r.stale[p]
}

// Owned lists the partitions this instance owns, current or not.
func (r *Restorer) Owned() []int32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ps []int32
	for p, o := range r.owned {
		if o {
			ps = append(ps, p)
		}
	}
	return ps
}

// EnsureAll rebuilds every stale partition this instance owns, as Ensure
// does when a record of one arrives; call it on the processing goroutine
// (OnIdle), so partitions without traffic become current too.
func (r *Restorer) EnsureAll(ctx context.Context) error {
	r.mu.Lock()
	var first int32 = -1
	for p, s := range r.stale {
		if s && r.owned[p] {
			first = p
			break
		}
	}
	r.mu.Unlock()
	if first < 0 {
		return nil
	}
	return r.Ensure(ctx, first)
}

// assigned marks newly assigned partitions stale.
func (r *Restorer) assigned(as map[string][]int32) {
	r.mu.Lock()
	for _, ps := range as {
		for _, p := range ps {
			r.stale[p] = true
			r.owned[p] = true
			r.gen[p]++
		}
	}
	r.mu.Unlock()
	if r.AfterAssign != nil {
		r.AfterAssign()
	}
}

// Ensure rebuilds every stale partition this instance owns (all at once,
// so a rebalance costs one read) when partition is among them.
func (r *Restorer) Ensure(ctx context.Context, partition int32) error {
	r.mu.Lock()
	if !r.stale[partition] && r.owned[partition] {
		r.mu.Unlock()
		return nil
	}
	r.stale[partition], r.owned[partition] = true, true // records before the callback ran
	var ps []int32
	gens := map[int32]uint64{}
	for p, s := range r.stale {
		if s && r.owned[p] { // a revoked partition waits for its next assignment
			ps = append(ps, p)
			gens[p] = r.gen[p]
		}
	}
	r.mu.Unlock()
	same, err := r.unchanged(ctx, ps)
	if err != nil {
		return err
	}
	var rebuild []int32
	for _, p := range ps {
		if !same[p] {
			rebuild = append(rebuild, p)
		}
	}
	if len(rebuild) > 0 {
		if err := r.Rebuild(ctx, rebuild...); err != nil {
			return err
		}
	}
	r.mu.Lock()
	for _, p := range ps {
		// Assigned again while the rebuild ran: the rebuild may predate
		// the other owner's last writes, so the partition stays stale.
		if r.gen[p] == gens[p] {
			r.stale[p] = false
		}
	}
	r.mu.Unlock()
	return nil
}

// Guard is h run holding mu, once the record's partition is restored
// (Ensure, under mu too: the restorer's clear and apply callbacks then
// change the state the handler reads with the same lock held). A
// processor's handler is Guard(&mu, route) rather than its own Ensure.
func (r *Restorer) Guard(mu sync.Locker, h Handler) Handler {
	return func(ctx context.Context, in *kgo.Record, out *Output) error {
		mu.Lock()
		defer mu.Unlock()
		if err := r.Ensure(ctx, in.Partition); err != nil {
			return err
		}
		return h(ctx, in, out)
	}
}

// Rebuild clears partitions and replays the changelogs' same partitions
// into the store.
func (r *Restorer) Rebuild(ctx context.Context, partitions ...int32) error {
	set := make(map[int32]bool, len(partitions))
	for _, p := range partitions {
		set[p] = true
	}
	if err := r.clear(set); err != nil {
		return fmt.Errorf("restore: clear partitions %v: %w", partitions, err)
	}
	var upTo map[string]map[int32]int64
	if r.group != "" {
		var err error
		if upTo, err = committedOffsets(ctx, r.cluster, r.group, r.inputs); err != nil {
			return err
		}
	}
	if err := readPartitions(ctx, r.cluster, r.topics, partitions, upTo, r.apply); err != nil {
		return err
	}
	if r.AfterRebuild != nil {
		return r.AfterRebuild()
	}
	return nil
}

// committedOffsets returns group's committed offsets on topics.
func committedOffsets(ctx context.Context, cluster Cluster, group string, topics map[string]bool) (map[string]map[int32]int64, error) {
	cl, err := cluster.NewClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("restore: committed offsets of group %s: %w", group, err)
	}
	out := map[string]map[int32]int64{}
	for t := range topics {
		out[t] = map[int32]int64{} // no commit: nothing applied yet
	}
	resp.Each(func(o kadm.OffsetResponse) {
		if topics[o.Topic] {
			out[o.Topic][o.Partition] = o.At
		}
	})
	return out, nil
}

// ReadPartitions reads the given partitions of topics from their start to
// their last stable offset (read_committed), calling fn in partition order.
func ReadPartitions(ctx context.Context, cluster Cluster, topics []string, partitions []int32, fn func(*kgo.Record) error) error {
	return readPartitions(ctx, cluster, topics, partitions, nil, fn)
}

// settleWait bounds how long a rebuild waits for transactions open on its
// partitions to end: the previous owner's last one ends within its
// transaction timeout (streams.TransactionTimeout, 20 s by default).
const settleWait = time.Minute

// settledOffsets lists the last stable offsets of the wanted partitions
// once every transaction that was open on them when it was called has
// ended. Reading only to the stable offset as it stood would leave out a
// batch the partition's previous owner had produced but not yet committed:
// its offsets commit with it, so the new owner never processes those
// inputs again, and its rebuilt state would lack that batch for good (a
// ledger would miss bookings, or a withdrawal).
func settledOffsets(ctx context.Context, adm *kadm.Client, topics []string, want map[int32]bool) (kadm.ListedOffsets, error) {
	var ends, stable kadm.ListedOffsets
	list := func(fn func(context.Context, ...string) (kadm.ListedOffsets, error), into *kadm.ListedOffsets) error {
		return retryFor(ctx, 10*time.Second, func() error {
			var err error
			if *into, err = fn(ctx, topics...); err == nil {
				err = into.Error()
			}
			return err
		})
	}
	if err := list(adm.ListEndOffsets, &ends); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(settleWait)
	for {
		if err := list(adm.ListCommittedOffsets, &stable); err != nil {
			return nil, err
		}
		open := 0
		ends.Each(func(o kadm.ListedOffset) {
			if s, ok := stable.Lookup(o.Topic, o.Partition); want[o.Partition] && ok && s.Offset < o.Offset {
				open++
			}
		})
		if open == 0 {
			return stable, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d partitions still have a transaction open after %v", open, settleWait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readPartitions is ReadPartitions with, for the topics in upTo, a lower
// end per partition.
func readPartitions(ctx context.Context, cluster Cluster, topics []string, partitions []int32, upTo map[string]map[int32]int64, fn func(*kgo.Record) error) error {
	cl, err := cluster.NewClient()
	if err != nil {
		return err
	}
	adm := kadm.NewClient(cl)
	want := map[int32]bool{}
	for _, p := range partitions {
		want[p] = true
	}
	stable, err := settledOffsets(ctx, adm, topics, want)
	cl.Close()
	if err != nil {
		return fmt.Errorf("restore: last stable offsets of %v: %w", topics, err)
	}
	offsets := map[string]map[int32]kgo.Offset{}
	ends := map[string]map[int32]int64{}
	stable.Each(func(o kadm.ListedOffset) {
		if lim, ok := upTo[o.Topic]; ok {
			o.Offset = min(o.Offset, lim[o.Partition])
		}
		if !want[o.Partition] || o.Offset <= 0 {
			return
		}
		if offsets[o.Topic] == nil {
			offsets[o.Topic], ends[o.Topic] = map[int32]kgo.Offset{}, map[int32]int64{}
		}
		offsets[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		ends[o.Topic][o.Partition] = o.Offset
	})
	if len(offsets) == 0 {
		return nil
	}
	return readRanges(ctx, cluster, offsets, ends, fn)
}

// readRanges reads each topic partition of from, from its offset up to
// (not including) its offset in ends, read_committed, calling fn in
// partition order. Each topic ends by the catch-up rule of every restore:
// a partition ends at its last record before the end offset or, when only
// transaction markers are left (they take offsets but are never
// returned), once idle.
func readRanges(ctx context.Context, cluster Cluster, from map[string]map[int32]kgo.Offset, ends map[string]map[int32]int64, fn func(*kgo.Record) error) error {
	return readRangesOf(ctx, cluster, from, ends, false, fn)
}

// readRangesOf is readRanges of topics that transactions alone write when
// txn is set (CatchUp.Transactional).
func readRangesOf(ctx context.Context, cluster Cluster, from map[string]map[int32]kgo.Offset, ends map[string]map[int32]int64, txn bool, fn func(*kgo.Record) error) error {
	// Transaction markers are kept (not passed to fn): a partition whose
	// tail is an aborted transaction (a batch aborted just before a
	// restore, a fenced instance's) is seen to end at its marker at once,
	// instead of after CatchUp's idle give-up (5 s).
	rc, err := cluster.NewClient(kgo.ConsumePartitions(from),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		return err
	}
	defer rc.Close()
	cus := map[string]*CatchUp{}
	for t, e := range ends {
		cus[t] = NewCatchUp(e)
		for p, o := range from[t] {
			if at := o.EpochOffset().Offset; at >= 0 {
				cus[t].From(p, at)
			}
		}
		if txn {
			cus[t].Transactional()
		}
	}
	done := func() bool {
		for _, cu := range cus {
			if !cu.Done() {
				return false
			}
		}
		return true
	}
	for !done() {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		f := rc.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		f.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
		})
		if ferr != nil {
			return ferr
		}
		counts := map[string]int{}
		var cbErr error
		f.EachPartition(func(p kgo.FetchTopicPartition) {
			cu := cus[p.Topic]
			end := ends[p.Topic][p.Partition]
			for _, r := range p.Records {
				cu.Saw(r)
				if r.Offset >= end {
					break
				}
				counts[p.Topic]++
				if r.Attrs.IsControl() {
					continue
				}
				if cbErr == nil {
					cbErr = fn(r)
				}
			}
		})
		if cbErr != nil {
			return cbErr
		}
		for t, cu := range cus {
			cu.Polled(counts[t])
		}
	}
	return nil
}
