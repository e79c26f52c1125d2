package planner

// Checkpoints. The planner's memory (job states, open jobs, the CRC
// filter, the day's quota and jobs per account) is what replaying
// push.job-transitions builds, and rebuilding it meant reading a month of
// transitions and the filtered package of every job queued in it, on every
// start, fail-over and aborted batch. Instead the active planner writes its
// memory, with the position in push.job-transitions it stands for, to the
// compacted push.planner-checkpoints every CheckpointEvery, inside the
// transaction of a batch; a restore loads the newest whole checkpoint and
// replays only the transitions after its position.
//
// The memory written is the one at the start of the batch (BeforeBatch:
// every batch before it committed, so it is exactly what the transitions
// up to the position say), written by the batch's transaction (AfterBatch):
// only the planner that owns the partitions can commit it, so a fenced
// planner's late checkpoint never lands.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// checkpointChunk bounds one checkpoint record, well under the broker's
// default record limit (1 MiB).
const checkpointChunk = 512 << 10

// checkpoints is the planner's bookkeeping of its checkpoints; guarded by
// the planner's mu.
type checkpoints struct {
	// next is the position in push.job-transitions that the memory stands
	// for: where the last restore stopped, moved past each committed
	// batch's transitions.
	next map[int32]int64
	// batch are the transitions the batch in flight emits (their offsets
	// are known once it committed).
	batch []*kgo.Record
	// pending is the encoded memory taken at the batch's start, to be
	// written by the batch; nil when no checkpoint is due.
	pending []byte
	last    time.Time // when the last checkpoint committed (or was restored)
	id      uint64    // the newest checkpoint's id
	chunks  int       // chunk keys on the topic (a smaller checkpoint tombstones the rest)
	written int       // chunks the batch in flight writes
	writeID uint64    // and their checkpoint's id
}

// RestoreStats says how the last restore went (logs, tests, benchmarks).
type RestoreStats struct {
	FromCheckpoint bool          // a checkpoint was loaded
	CheckpointAge  time.Duration // how old it was
	Transitions    int           // transitions replayed after it (or all of them)
	Took           time.Duration
}

// LastRestore reports the last restore.
func (p *Planner) LastRestore() RestoreStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restoreStats
}

// captureCheckpoint encodes the memory if a checkpoint is due: BeforeBatch,
// so it is the memory every committed batch left.
func (p *Planner) captureCheckpoint() {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &p.ckpt
	c.batch, c.pending = c.batch[:0], nil
	if p.cfg.CheckpointEvery <= 0 || p.stale || p.restoreErr != nil || c.next == nil ||
		p.cfg.Now().Sub(c.last) < p.cfg.CheckpointEvery {
		return
	}
	st, err := p.snapshot()
	if err == nil {
		c.pending, err = proto.Marshal(st)
	}
	if err != nil {
		p.log.Warn("planner: checkpoint not taken", "err", err)
		c.pending = nil
	}
}

// snapshot is the memory as a PlannerState.
func (p *Planner) snapshot() (*pb.PlannerState, error) {
	st := &pb.PlannerState{TransitionsNext: maps.Clone(p.ckpt.next), States: p.machine.States(),
		JobsDay: p.jobsDay, JobsToday: maps.Clone(p.jobsToday)}
	for _, q := range p.queue {
		o := &pb.PlannerOpenJob{Job: q.job, Position: uint64(q.next), QueuedAtMs: q.queuedAt}
		for _, u := range slices.Sorted(maps.Keys(q.holder)) {
			h := q.holder[u]
			o.Holders = append(o.Holders, &pb.UnitHolder{UnitId: u, Executor: h.executor, DispatchSeq: h.seq})
		}
		st.Open = append(st.Open, o)
	}
	sent, err := p.sent.Export()
	if err != nil {
		return nil, err
	}
	for crc, uins := range sent {
		st.Sent = append(st.Sent, &pb.ContentSent{Crc: crc, Uins: uins})
	}
	if st.QuotaDay, st.QuotaLevels, err = p.ledger.Export(); err != nil {
		return nil, err
	}
	return st, nil
}

// emitCheckpoint writes the memory taken at the batch's start with the
// batch (AfterBatch), and notes the batch's transitions; called again
// when the batch is retried.
func (p *Planner) emitCheckpoint(out *streams.Output) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := &p.ckpt
	c.batch, c.written = c.batch[:0], 0
	topic := p.cfg.Topic(schemas.TopicJobTransitions)
	for _, r := range out.Records() {
		if r.Topic == topic {
			c.batch = append(c.batch, r)
		}
	}
	if c.pending == nil {
		return nil
	}
	ckTopic := p.cfg.Topic(schemas.TopicPlannerCkpt)
	n := max((len(c.pending)+checkpointChunk-1)/checkpointChunk, 1)
	id := max(c.id+1, uint64(p.cfg.Now().UnixMilli()))
	at := p.cfg.Now().UnixMilli()
	for i := range n {
		part := c.pending[i*checkpointChunk : min((i+1)*checkpointChunk, len(c.pending))]
		if err := out.EmitMsg(ckTopic, strconv.AppendInt(nil, int64(i), 10),
			&pb.PlannerCheckpoint{CheckpointId: id, Index: uint32(i), Chunks: uint32(n), Data: part, AtMs: at}); err != nil {
			return err
		}
	}
	// Chunk keys past this checkpoint's belong to an older, larger one.
	for i := n; i < c.chunks; i++ {
		out.Emit(&kgo.Record{Topic: ckTopic, Key: strconv.AppendInt(nil, int64(i), 10)})
	}
	c.written, c.writeID = n, id
	return nil
}

// checkpointBatchEnd moves the position past a committed batch's
// transitions and books its checkpoint (OnBatchEnd).
func (p *Planner) checkpointBatchEnd(committed bool) {
	c := &p.ckpt
	if committed && c.next != nil {
		for _, r := range c.batch {
			if r.Offset+1 > c.next[r.Partition] {
				c.next[r.Partition] = r.Offset + 1
			}
		}
		if c.written > 0 {
			c.id, c.chunks, c.last = c.writeID, c.written, p.cfg.Now()
			p.mCheckpointBytes.With().Set(float64(len(c.pending)))
		}
	}
	c.batch, c.pending, c.written = c.batch[:0], nil, 0
}

// loadCheckpoint reads the newest whole checkpoint; ok is false when the
// topic holds none.
func (p *Planner) loadCheckpoint(ctx context.Context, kc streams.Cluster) (st *pb.PlannerState, at time.Time, ok bool, err error) {
	type building struct {
		chunks map[uint32][]byte
		count  uint32
		at     int64
	}
	var best *building
	var bestID uint64
	maxIndex := -1
	partial := map[uint64]*building{}
	// Only planners write checkpoints, in their transactions.
	err = streams.Replay(ctx, kc, p.cfg.Topic(schemas.TopicPlannerCkpt), streams.ReplayFrom{Transactional: true}, func(r *kgo.Record) error {
		if i, err := strconv.Atoi(string(r.Key)); err == nil && i > maxIndex {
			maxIndex = i
		}
		if r.Value == nil {
			return nil
		}
		var c pb.PlannerCheckpoint
		if streams.Decode(r, &c) != nil || c.Chunks == 0 || c.Index >= c.Chunks || c.CheckpointId <= bestID {
			return nil // not one, or older than a whole one already read
		}
		b := partial[c.CheckpointId]
		if b == nil {
			b = &building{chunks: map[uint32][]byte{}, count: c.Chunks, at: c.AtMs}
			partial[c.CheckpointId] = b
		}
		b.chunks[c.Index] = c.Data
		if uint32(len(b.chunks)) == b.count {
			best, bestID = b, c.CheckpointId
			for id := range partial {
				if id <= bestID {
					delete(partial, id)
				}
			}
		}
		return nil
	})
	p.ckpt.chunks = maxIndex + 1
	if err != nil || best == nil {
		return nil, time.Time{}, false, err
	}
	var data []byte
	for i := range best.count {
		data = append(data, best.chunks[i]...)
	}
	st = &pb.PlannerState{}
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, time.Time{}, false, fmt.Errorf("planner: checkpoint %d: %w", bestID, err)
	}
	p.ckpt.id = bestID
	return st, time.UnixMilli(best.at), true, nil
}

// load puts a checkpoint's memory in place (after reset).
func (p *Planner) load(st *pb.PlannerState) error {
	p.machine.Load(st.States)
	sent := make(map[uint32][]byte, len(st.Sent))
	for _, s := range st.Sent {
		sent[s.Crc] = s.Uins
	}
	if err := p.sent.Import(sent); err != nil {
		return err
	}
	if err := p.ledger.Import(st.QuotaDay, st.QuotaLevels); err != nil {
		return err
	}
	p.jobsDay, p.jobsToday = st.JobsDay, maps.Clone(st.JobsToday)
	if p.jobsToday == nil {
		p.jobsToday = map[uint64]uint32{}
	}
	return nil
}
