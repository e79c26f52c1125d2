package planner

import (
	"testing"
	"time"

	"surge/processors/push/internal/quota"
)

// Whatever the hour, the demo clock is on a day with every quota unit
// released and no release still to come, and it runs at the wall's pace.
func TestReleasedDayClock(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 42} {
		clock := ReleasedDayClock(seed)
		now := clock()
		if got := quota.Released(now, seed); got != quota.PerDay {
			t.Fatalf("seed %d: %d of %d units released at %v", seed, got, quota.PerDay, now)
		}
		if next, ok := quota.NextRelease(now, seed); ok {
			t.Fatalf("seed %d: a release still to come at %v", seed, next)
		}
		if now.Hour() != 23 || now.Minute() != 0 {
			t.Fatalf("seed %d: the clock starts at %v, want 23:00", seed, now)
		}
		time.Sleep(20 * time.Millisecond)
		if d := clock().Sub(now); d < 20*time.Millisecond || d > time.Second {
			t.Fatalf("seed %d: 20 ms later the clock moved %v", seed, d)
		}
	}
}
