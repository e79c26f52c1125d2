package admission

import (
	"context"
	"sync"
	"time"
)

// limiter is the gate's slots: at most limit requests in flight, the rest
// waiting in arrival order. The limit adapts to the service's latency
// (additive increase, multiplicative decrease): while admitted requests
// take longer than the target, it shrinks by a tenth at most every
// decreaseEvery; while they are faster, it grows by one per round of
// requests, up to the configured maximum. So under overload the requests
// inside the service do not queue behind each other (a batcher, a Redis
// pipeline, a produce), the excess waits here, briefly, or is refused, and
// the admitted are answered in about the target.
type limiter struct {
	mu         sync.Mutex
	inFlight   int
	limit      float64
	min, max   float64
	target     time.Duration
	lastCut    time.Time
	waiters    []*waiter
	smoothedNs float64 // moving average of admitted requests' time in service
}

type waiter struct {
	ch      chan struct{}
	granted bool // a slot was handed to it
	gone    bool // it stopped waiting
}

// decreaseEvery spaces the limit's cuts: the requests already in flight
// when it was cut still finish slowly and must not cut it again.
const decreaseEvery = 100 * time.Millisecond

func newLimiter(max int, target time.Duration) *limiter {
	lo := float64(min(8, max))
	return &limiter{limit: float64(max), min: lo, max: float64(max), target: target}
}

// tryAcquire takes a slot when one is free and nobody waits.
func (l *limiter) tryAcquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.waiters) == 0 && l.inFlight < int(l.limit) {
		l.inFlight++
		return true
	}
	return false
}

// acquire waits up to budget for a slot, in arrival order; false when the
// budget ran out or ctx ended first.
func (l *limiter) acquire(ctx context.Context, budget time.Duration) (ok, timedOut bool) {
	l.mu.Lock()
	if len(l.waiters) == 0 && l.inFlight < int(l.limit) {
		l.inFlight++
		l.mu.Unlock()
		return true, false
	}
	w := &waiter{ch: make(chan struct{})}
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case <-w.ch:
		return true, false
	case <-t.C:
		timedOut = true
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.granted { // handed a slot as it gave up: pass it on
		l.inFlight--
		l.grantLocked()
		return false, timedOut
	}
	w.gone = true
	return false, timedOut
}

// release frees a slot held for d, adapts the limit to d, and hands free
// slots to the waiters.
func (l *limiter) release(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	if l.smoothedNs == 0 {
		l.smoothedNs = float64(d)
	}
	l.smoothedNs += (float64(d) - l.smoothedNs) / 16
	now := time.Now()
	switch {
	case d > l.target && now.Sub(l.lastCut) >= decreaseEvery:
		l.limit = max(l.min, l.limit*0.9)
		l.lastCut = now
	case d <= l.target:
		l.limit = min(l.max, l.limit+1/l.limit)
	}
	l.grantLocked()
}

// giveBack frees a slot that served nothing (its client had gone).
func (l *limiter) giveBack() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	l.grantLocked()
}

func (l *limiter) grantLocked() {
	for l.inFlight < int(l.limit) && len(l.waiters) > 0 {
		w := l.waiters[0]
		l.waiters[0] = nil
		l.waiters = l.waiters[1:]
		if w.gone {
			continue
		}
		w.granted = true
		l.inFlight++
		close(w.ch)
	}
}

// state is the limit and the smoothed service time, for the gate's
// estimates and metrics.
func (l *limiter) state() (limit int, service time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit), time.Duration(l.smoothedNs)
}
