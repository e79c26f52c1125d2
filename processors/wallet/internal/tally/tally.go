// Package tally keeps counters in Redis that are a cache of what the
// topics say: budget spent per phase, coupon stock taken per template. A
// counter is taken from only while it exists. One that is missing (a Redis
// that lost its data, a new deployment) is not started again at zero,
// which would spend the budget a second time: its owner rebuilds it from
// the topics first (Init), and refuses the work that needs it until then.
//
// Every operation touches one key, so a Redis Cluster spreads counters
// over its slots.
package tally

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// ErrMissing is a counter that does not exist: rebuild it before use.
var ErrMissing = errors.New("tally: counter missing (Redis lost it, or it was never built): rebuilding from the topics")

// ErrOver is a take that would pass the limit; nothing was taken.
var ErrOver = errors.New("tally: over the limit")

// take adds ARGV[1] to KEYS[1] if it exists (or ARGV[3] is "1": create
// at zero) and the sum stays within ARGV[2]; -1 missing, -2 over, else
// the new value.
var take = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur and ARGV[3] ~= '1' then return -1 end
local v = tonumber(cur or '0') + tonumber(ARGV[1])
if v > tonumber(ARGV[2]) then return -2 end
redis.call('SET', KEYS[1], v)
return v`)

// give subtracts ARGV[1] from KEYS[1] if it exists: a refund never
// creates a counter a rebuild must make.
var give = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('DECRBY', KEYS[1], ARGV[1])`)

// Counter is one way to reach counters: whether a missing one is an error
// (rebuilt from topics) or starts at zero (a component run without the
// topics, in tests of it alone).
type Counter struct {
	rdb           redis.UniversalClient
	createMissing bool
}

// New returns counters in rdb; a missing one is ErrMissing unless
// createMissing.
func New(rdb redis.UniversalClient, createMissing bool) Counter {
	return Counter{rdb: rdb, createMissing: createMissing}
}

// CreatesMissing reports whether a missing counter starts at zero.
func (c Counter) CreatesMissing() bool { return c.createMissing }

// Take adds n to key if the result stays within limit, and returns it.
func (c Counter) Take(ctx context.Context, key string, n, limit int64) (int64, error) {
	create := "0"
	if c.createMissing {
		create = "1"
	}
	v, err := take.Run(ctx, c.rdb, []string{key}, n, limit, create).Int64()
	switch {
	case err != nil:
		return 0, err
	case v == -1:
		return 0, ErrMissing
	case v == -2:
		return 0, ErrOver
	}
	return v, nil
}

// Give queues on pipe the return of n to key, if it exists. (Eval, not
// EvalSha: a refund is rare, and a pipeline cannot load a missing script.)
func (c Counter) Give(ctx context.Context, pipe redis.Pipeliner, key string, n int64) {
	give.Eval(ctx, pipe, []string{key}, n)
}

// Init sets key to v unless it exists: a counter that survived holds at
// least what the topics say, so it is kept.
func (c Counter) Init(ctx context.Context, pipe redis.Pipeliner, key string, v int64) {
	pipe.SetNX(ctx, key, v, 0)
}
