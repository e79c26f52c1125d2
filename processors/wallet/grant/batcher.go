package grant

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	pb "surge/schemas/surgev1"
)

// Batcher coalesces concurrent Grant calls into GrantBatch calls: at the
// grant peak (seed: 1.8M a second) a Redis round trip and a produce per
// grant would be the bound, one per batch is not. A caller waits at most
// the linger time for its batch to fill.
type Batcher struct {
	in     *Intake
	reqs   chan batchReq
	max    int
	linger time.Duration
	stop   chan struct{}
}

type batchReq struct {
	g    *pb.RewardGrant
	done chan Outcome // a Grant call's answer
	many *manyReq     // or a GrantBatch call's, at index i
	i    int
}

// manyReq is a GrantBatch call waiting for its grants' outcomes.
type manyReq struct {
	outs []Outcome
	left atomic.Int32 // outcomes still to come; who takes it to 0 closes done
	done chan struct{}
}

func (m *manyReq) answered(n int) {
	if m.left.Add(-int32(n)) == 0 {
		close(m.done)
	}
}

// ErrClosed is returned after Close.
var ErrClosed = errors.New("grant: batcher closed")

// NewBatcher starts workers that each send batches of up to max grants.
func NewBatcher(in *Intake, size int, linger time.Duration, workers int) *Batcher {
	b := &Batcher{in: in, reqs: make(chan batchReq, size*workers), max: size, linger: linger, stop: make(chan struct{})}
	for range max(workers, 1) {
		go b.work()
	}
	return b
}

// replies recycles the callers' reply channels: one per grant was a
// tenth of the intake's CPU, mostly in the garbage collector.
var replies = sync.Pool{New: func() any { return make(chan Outcome, 1) }}

// Grant accepts one grant through a batch.
func (b *Batcher) Grant(ctx context.Context, g *pb.RewardGrant) (*Result, error) {
	r := batchReq{g: g, done: replies.Get().(chan Outcome)}
	if err := b.hand(ctx, r); err != nil {
		replies.Put(r.done)
		return nil, err
	}
	select {
	case o := <-r.done:
		replies.Put(r.done) // drained: nobody sends on it again
		return o.Result, o.Err
	case <-ctx.Done():
		// Not recycled: the batch may still answer on it.
		return nil, ctx.Err() // the grant may still be accepted: retry with the same order number
	}
}

// GrantBatch accepts many grants through the batches, each with its own
// outcome: a request that carries many grants hands them over without a
// goroutine and a reply channel each (they were a tenth of the HTTP batch
// path's CPU). If ctx ends or the batcher closes first, every outcome is
// that error, and the grants already handed over may still be accepted:
// retry them with the same order numbers.
func (b *Batcher) GrantBatch(ctx context.Context, gs []*pb.RewardGrant) []Outcome {
	m := &manyReq{outs: make([]Outcome, len(gs)), done: make(chan struct{})}
	m.left.Store(int32(len(gs)))
	if len(gs) == 0 {
		return m.outs
	}
	for i, g := range gs {
		err := b.hand(ctx, batchReq{g: g, many: m, i: i})
		if err == nil {
			continue
		}
		for j := i; j < len(gs); j++ { // not handed over: answered here
			m.outs[j] = Outcome{Err: err}
		}
		m.answered(len(gs) - i)
		break
	}
	var err error
	select {
	case <-m.done:
		return m.outs
	case <-ctx.Done():
		err = ctx.Err()
	case <-b.stop: // the workers may be gone with grants still queued
		err = ErrClosed
	}
	outs := make([]Outcome, len(gs)) // m.outs may still be written
	for i := range outs {
		outs[i] = Outcome{Err: err}
	}
	return outs
}

// hand gives r to the workers. After Close it refuses r even when the
// queue still has room: no worker may be left to answer.
func (b *Batcher) hand(ctx context.Context, r batchReq) error {
	select {
	case <-b.stop:
		return ErrClosed
	default:
	}
	select {
	case b.reqs <- r:
		return nil
	case <-b.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the workers once the queued grants are sent.
func (b *Batcher) Close() { close(b.stop) }

func (b *Batcher) work() {
	batch := make([]batchReq, 0, b.max)
	gs := make([]*pb.RewardGrant, 0, b.max)
	for {
		batch, gs = batch[:0], gs[:0]
		select {
		case r := <-b.reqs:
			batch = append(batch, r)
		case <-b.stop:
			return
		}
		timer := time.NewTimer(b.linger)
	fill:
		for len(batch) < b.max {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			case <-timer.C:
				break fill
			}
		}
		timer.Stop()
		for _, r := range batch {
			gs = append(gs, r.g)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		outs := b.in.GrantBatch(ctx, gs)
		cancel()
		for i, r := range batch {
			if r.many != nil {
				r.many.outs[r.i] = outs[i]
				r.many.answered(1)
				continue
			}
			r.done <- outs[i]
		}
	}
}
