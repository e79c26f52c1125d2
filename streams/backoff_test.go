package streams_test

import (
	"testing"
	"time"

	"surge/streams"
)

// Retry waits are spread over [d/2, d): instances that failed together do
// not retry together.
func TestJitterSpreadsRetries(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		j := streams.Jitter(time.Second)
		if j < 500*time.Millisecond || j >= time.Second {
			t.Fatalf("jitter(1s) = %s", j)
		}
		seen[j] = true
	}
	if len(seen) < 50 {
		t.Fatalf("%d distinct waits of 100", len(seen))
	}
}
