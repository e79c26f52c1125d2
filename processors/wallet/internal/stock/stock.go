// Package stock controls coupon stock per template in Redis. Consumption is
// counted with INCRBY and compared with the stock; a hot template is split
// over several keys, each holding a share, so one key never takes the
// whole load. A timed-out INCRBY is not retried (it may have counted): the
// 5% buffer held back from every template covers such lost units, so stock
// is never oversold. Issuers stop when less than 10% remains.
package stock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/processors/wallet/internal/tally"
)

// Rules from the seed.
const (
	BufferShare = 0.05 // held back for timed-out increments
	StopShare   = 0.10 // issuers stop below this share remaining
)

// ErrOut is a refusal: the template has no stock left.
var ErrOut = errors.New("stock: out of stock")

// ErrLow is a refusal: less than StopShare of the template's stock
// remains, so the wallet stops issuing it (the caller offers something
// else: the seed's issuers fall back to a blessing).
var ErrLow = errors.New("stock: less than 10% left: issuing stopped")

// ErrTimeout is an increment whose outcome is unknown; it is counted as
// consumed and never retried.
var ErrTimeout = errors.New("stock: timed out; not retried")

// Control is the stock of templates in one Redis.
type Control struct {
	rdb    redis.UniversalClient
	tally  tally.Counter
	prefix string
	splits int

	mu   sync.Mutex
	seen map[string]remainingSeen // per template, for CheckStop
}

// remainingSeen is a template's remaining stock as last read, less what
// this instance took since.
type remainingSeen struct {
	at        time.Time
	remaining int64
}

// StopCheckEvery is how often CheckStop reads a template's remaining
// stock (one pipeline of GETs), not per grant; between reads it counts down its own
// takes, so one instance stops exactly and others within this time.
const StopCheckEvery = 100 * time.Millisecond

// New returns a stock control with keys under prefix, each template split
// over splits keys, counted by t (which says whether a missing key is
// tally.ErrMissing, to rebuild with Restore, or starts at zero).
func New(rdb redis.UniversalClient, t tally.Counter, prefix string, splits int) *Control {
	return &Control{rdb: rdb, tally: t, prefix: prefix, splits: max(splits, 1), seen: map[string]remainingSeen{}}
}

// Restore sets tpl's keys (of total stock) to account for taken units, as
// the topics say, unless a key exists: the taken units fill the keys'
// shares in order. A key that survived keeps what it holds (at least what
// it took), so a partly lost Redis oversells nothing.
func (c *Control) Restore(ctx context.Context, pipe redis.Pipeliner, tpl string, total, taken int64) {
	for i, share := range c.shares(total) {
		n := min(share, taken)
		taken -= n
		if i == c.splits-1 {
			n += taken // more than the sellable stock was taken (a timed-out take): keep it counted
		}
		c.tally.Init(ctx, pipe, c.key(tpl, i), n)
	}
	c.mu.Lock()
	delete(c.seen, tpl)
	c.mu.Unlock()
}

// Keys are the Redis keys of tpl's stock (to check they exist).
func (c *Control) Keys(tpl string) []string {
	out := make([]string, c.splits)
	for i := range out {
		out[i] = c.key(tpl, i)
	}
	return out
}

func (c *Control) key(tpl string, i int) string { return fmt.Sprintf("%s%s:%d", c.prefix, tpl, i) }

// shares splits the sellable stock (total minus the buffer) over the keys.
func (c *Control) shares(total int64) []int64 {
	sellable := total - int64(float64(total)*BufferShare)
	out := make([]int64, c.splits)
	for i := range out {
		out[i] = sellable / int64(c.splits)
		if int64(i) < sellable%int64(c.splits) {
			out[i]++
		}
	}
	return out
}

// Take consumes n units of tpl (of total stock). It tries the keys from a
// random one on: a key whose share n would pass is left as it is and the
// next is tried (check and take are one script); all full means out of
// stock. A missing key is tally.ErrMissing: nothing is taken until the
// stock is restored from the topics.
func (c *Control) Take(ctx context.Context, tpl string, total, n int64) error {
	shares := c.shares(total)
	start := rand.IntN(c.splits)
	for k := range c.splits {
		i := (start + k) % c.splits
		if shares[i] < n {
			continue
		}
		_, err := c.tally.Take(ctx, c.key(tpl, i), n, shares[i])
		switch {
		case errors.Is(err, tally.ErrOver):
			continue // over this key's share: the next key
		case errors.Is(err, tally.ErrMissing):
			return err
		case err != nil:
			if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
				return ErrTimeout
			}
			return err
		}
		c.mu.Lock()
		if s, ok := c.seen[tpl]; ok {
			s.remaining -= n
			c.seen[tpl] = s
		}
		c.mu.Unlock()
		return nil
	}
	return ErrOut
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// Remaining is what can still be sold (over every key).
func (c *Control) Remaining(ctx context.Context, tpl string, total int64) (int64, error) {
	// One GET per key in a pipeline, not MGET: the keys spread a hot
	// template over a Redis Cluster's slots, which one MGET cannot span.
	pipe := c.rdb.Pipeline()
	gets := make([]*redis.StringCmd, c.splits)
	for i := range gets {
		gets[i] = pipe.Get(ctx, c.key(tpl, i))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	var used int64
	for _, g := range gets {
		n, err := g.Int64()
		switch {
		case errors.Is(err, redis.Nil) && !c.tally.CreatesMissing():
			return 0, tally.ErrMissing
		case err != nil && !errors.Is(err, redis.Nil):
			return 0, err
		}
		used += n
	}
	var sellable int64
	for _, s := range c.shares(total) {
		sellable += s
	}
	return max(sellable-used, 0), nil
}

// Low reports whether remaining, of a template's total stock, is below
// the share at which issuers stop (StopShare).
func Low(remaining, total int64) bool { return float64(remaining) < StopShare*float64(total) }

// ShouldStop reports whether issuers should stop offering tpl: less than
// 10% of its stock remains.
func (c *Control) ShouldStop(ctx context.Context, tpl string, total int64) (bool, error) {
	r, err := c.Remaining(ctx, tpl, total)
	if err != nil {
		return false, err
	}
	return Low(r, total), nil
}

// CheckStop is ErrLow once less than 10% of tpl's stock remains (see
// StopCheckEvery; the limit itself is Take's, exact).
func (c *Control) CheckStop(ctx context.Context, tpl string, total int64) error {
	c.mu.Lock()
	seen, ok := c.seen[tpl]
	c.mu.Unlock()
	if !ok || time.Since(seen.at) >= StopCheckEvery {
		r, err := c.Remaining(ctx, tpl, total)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.seen[tpl] = remainingSeen{at: time.Now(), remaining: r}
		seen = c.seen[tpl]
		c.mu.Unlock()
	}
	if Low(seen.remaining, total) {
		return ErrLow
	}
	return nil
}
