package grant

import (
	"context"
	"errors"
	"sync"
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
	done chan Outcome
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
	select {
	case b.reqs <- r:
	case <-b.stop:
		replies.Put(r.done)
		return nil, ErrClosed
	case <-ctx.Done():
		replies.Put(r.done)
		return nil, ctx.Err()
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
			r.done <- outs[i]
		}
	}
}
