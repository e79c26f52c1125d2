// Package counter is the live total shown to everyone (seed: 1.8M reads
// and 300k writes a second, where one Redis key takes about 30k).
//
// The total is derived from the bookings, not added up at intake: the
// ledger sums the cash grants it books per partition of wallet.ledger, in
// its store's batches (so the sums commit with the Kafka transaction and a
// rebuild from wallet.ledger computes them again), and once a second each
// ledger instance writes the cumulative sums of its partitions into one
// Redis hash, on the primary and the backup. A cumulative sum written
// twice, late or by a former owner of the partition changes nothing (a
// sum only replaces a smaller one), so a crash anywhere loses nothing and
// counts nothing twice: the total is the sum of distinct booked grants.
//
// Readers sum the hash once a second into a local value that only ever
// increases. A switch makes reads come from the backup.
package counter

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Counter is one instance's view of the live total.
type Counter struct {
	primary, backup redis.UniversalClient
	key             string
	shown           atomic.Int64
	readBackup      atomic.Bool
	backupSwitch    func() bool // when set, consulted at every refresh and publish
	Publishes       atomic.Int64
	log             *slog.Logger
}

// New returns a counter on the Redis hash key; backup may be nil.
func New(primary, backup redis.UniversalClient, key string, log *slog.Logger) *Counter {
	if log == nil {
		log = slog.Default()
	}
	return &Counter{primary: primary, backup: backup, key: key, log: log}
}

// Shown is the total to display: refreshed once a second, never lower
// than what was shown before.
func (c *Counter) Shown() int64 { return c.shown.Load() }

// ReadFromBackup switches reads to the backup Redis (the primary is down).
func (c *Counter) ReadFromBackup(on bool) { c.readBackup.Store(on) }

// FollowSwitch makes reads follow on(): from the backup while it says so
// (the wallet's degrade switch counter_primary, hot-reloaded with its
// configuration). Call it before Run.
func (c *Counter) FollowSwitch(on func() bool) { c.backupSwitch = on }

func (c *Counter) fromBackup() bool {
	if c.backupSwitch != nil {
		c.readBackup.Store(c.backupSwitch())
	}
	return c.readBackup.Load() && c.backup != nil
}

// raiseScript sets each field to its new cumulative sum unless it holds a
// larger one already: ARGV is field, sum, field, sum...
var raiseScript = redis.NewScript(`
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i+1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i+1]) end
end
return 0`)

// Publish writes cumulative sums per partition (one command for all of
// them) to the primary and the backup. The error of the Redis reads come
// from is returned (the primary's, or the backup's while reads are
// switched to it): the caller publishes again later, the sums are
// cumulative. A failed primary never keeps the backup from its write.
func (c *Counter) Publish(ctx context.Context, sums map[int32]int64) error {
	if len(sums) == 0 {
		return nil
	}
	args := make([]any, 0, 2*len(sums))
	for p, v := range sums {
		args = append(args, strconv.Itoa(int(p)), v)
	}
	perr := raiseScript.Run(ctx, c.primary, []string{c.key}, args...).Err()
	if c.backup == nil {
		if perr == nil {
			c.Publishes.Add(1)
		}
		return perr
	}
	berr := raiseScript.Run(ctx, c.backup, []string{c.key}, args...).Err()
	if c.fromBackup() {
		if perr != nil {
			c.log.Debug("counter: primary write failed; reads are on the backup", "err", perr)
		}
		if berr == nil {
			c.Publishes.Add(1)
		}
		return berr
	}
	if berr != nil {
		c.log.Warn("counter: dual write to backup failed", "err", berr)
	}
	if perr == nil {
		c.Publishes.Add(1)
	}
	return perr
}

// Run refreshes the shown total every period until ctx ends.
func (c *Counter) Run(ctx context.Context, period time.Duration) {
	c.Refresh(ctx)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Refresh(ctx)
		}
	}
}

// Total reads the sum of every partition's sum from Redis.
func (c *Counter) Total(ctx context.Context) (int64, error) {
	src := c.primary
	if c.fromBackup() {
		src = c.backup
	}
	vals, err := src.HVals(ctx, c.key).Result()
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, v := range vals {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue // not ours: nothing else writes this hash
		}
		sum += n
	}
	return sum, nil
}

// Refresh reads the total and raises the shown value if it grew.
func (c *Counter) Refresh(ctx context.Context) {
	v, err := c.Total(ctx)
	if err != nil {
		return
	}
	for {
		cur := c.shown.Load()
		if v <= cur || c.shown.CompareAndSwap(cur, v) {
			return
		}
	}
}
