package admission

import (
	"context"
	"testing"
	"time"
)

// TestLimitFollowsLatency: requests slower than the target shrink the
// number in flight (a tenth per cut, down to the floor), faster ones grow
// it back one per round; waiters get freed slots in arrival order.
func TestLimitFollowsLatency(t *testing.T) {
	l := newLimiter(100, 50*time.Millisecond)
	for range 60 {
		if !l.tryAcquire() {
			t.Fatal("no slot under the limit")
		}
		l.lastCut = time.Time{} // as if the last cut was long ago
		l.release(200 * time.Millisecond)
	}
	if limit, _ := l.state(); limit != 8 {
		t.Fatalf("after slow requests the limit is %d, want the floor 8", limit)
	}
	for range 8 * 20 {
		l.tryAcquire()
		l.release(5 * time.Millisecond)
	}
	// One per round of limit requests: limit² grows by 2 per request,
	// sqrt(8² + 2*160) = 19.6.
	if limit, _ := l.state(); limit < 18 || limit > 20 {
		t.Fatalf("after 160 fast requests from 8 the limit is %d, want 19", limit)
	}
	// Full: two waiters, served in order as slots free.
	limit, _ := l.state()
	for range limit {
		l.tryAcquire()
	}
	order := make(chan int, 2)
	for i := range 2 {
		go func() {
			if ok, _ := l.acquire(context.Background(), time.Second); ok {
				order <- i
			}
		}()
		time.Sleep(10 * time.Millisecond)
	}
	l.giveBack()
	first := <-order
	l.giveBack()
	if second := <-order; first != 0 || second != 1 {
		t.Fatalf("waiters served %d then %d, want arrival order", first, second)
	}
}
