// Package counter is the live total shown to everyone (seed: 1.8M reads
// and 300k writes a second, where one Redis key takes about 30k). Each
// instance adds into a local atomic; once a second it moves the local sum
// to one Redis key (swap to zero, INCRBY), on the primary and the backup
// Redis. Reads are served from a local value refreshed once a second that
// only ever increases. A switch makes reads come from the backup.
package counter

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counter is one instance's view of the live total.
type Counter struct {
	primary, backup redis.UniversalClient
	key             string
	local           atomic.Int64
	shown           atomic.Int64
	readBackup      atomic.Bool
	Flushes         atomic.Int64
	log             *slog.Logger
}

// New returns a counter on key; backup may be nil.
func New(primary, backup redis.UniversalClient, key string, log *slog.Logger) *Counter {
	if log == nil {
		log = slog.Default()
	}
	return &Counter{primary: primary, backup: backup, key: key, log: log}
}

// Add counts n locally; it never touches Redis.
func (c *Counter) Add(n int64) { c.local.Add(n) }

// Shown is the total to display: refreshed once a second, never lower
// than what was shown before.
func (c *Counter) Shown() int64 { return c.shown.Load() }

// ReadFromBackup switches reads to the backup Redis (the primary is down).
func (c *Counter) ReadFromBackup(on bool) { c.readBackup.Store(on) }

// Run flushes and refreshes every period until ctx ends, then flushes once
// more so nothing counted is lost.
func (c *Counter) Run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			c.Flush(fctx)
			cancel()
			return
		case <-t.C:
			c.Flush(ctx)
			c.Refresh(ctx)
		}
	}
}

// Flush moves the local sum to Redis. If the primary refuses, the sum goes
// back into the local counter for the next flush.
func (c *Counter) Flush(ctx context.Context) {
	n := c.local.Swap(0)
	if n == 0 {
		return
	}
	if err := c.primary.IncrBy(ctx, c.key, n).Err(); err != nil {
		c.local.Add(n)
		c.log.Warn("counter: flush to primary failed; kept locally", "err", err)
		return
	}
	c.Flushes.Add(1)
	if c.backup != nil {
		if err := c.backup.IncrBy(ctx, c.key, n).Err(); err != nil {
			c.log.Warn("counter: dual write to backup failed", "err", err)
		}
	}
}

// Refresh reads the total and raises the shown value if it grew.
func (c *Counter) Refresh(ctx context.Context) {
	src := c.primary
	if c.readBackup.Load() && c.backup != nil {
		src = c.backup
	}
	v, err := src.Get(ctx, c.key).Int64()
	if err != nil && err != redis.Nil {
		return
	}
	for {
		cur := c.shown.Load()
		if v <= cur || c.shown.CompareAndSwap(cur, v) {
			return
		}
	}
}
