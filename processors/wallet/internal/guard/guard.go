// Package guard holds the wallet's protections: rate limits per instance
// (a token bucket) and over all instances (a Redis counter per second),
// and the degrade switches that turn a weak dependency off at run time.
package guard

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// Degrade switch names: each weak dependency can be switched off.
const (
	TokenRedis  = "token_redis"  // tokens not written to / read from Redis: reads show booked only
	Lock        = "lock"         // withdrawals skip the per-user distributed lock
	Counter     = "counter"      // the live total stops counting
	Stock       = "stock"        // coupon grants refused rather than risk overselling
	GlobalLimit = "global_limit" // the distributed rate limit is skipped (per-instance still holds)
	// OrderClaim off: grants claimed by key (coupons, pendants, cash
	// while token_redis is off) skip the claim in Redis and are all taken
	// as new; their consumers' idempotency by order number (the ledger,
	// wallet.grants' readers) is what remains. A repeated order number
	// then takes budget and stock again: erring on the safe side. The
	// seed's switch that skips its idempotency store.
	OrderClaim = "order_claim"
	// CounterPrimary off: the live total's primary Redis is down; reads
	// come from the backup, which every publish still writes.
	CounterPrimary = "counter_primary"
)

// Bucket is a token bucket (golang.org/x/time/rate): rate per second,
// burst of one second; rate 0 means unlimited.
type Bucket struct{ l atomic.Pointer[rate.Limiter] }

// NewBucket returns a bucket; rate 0 means unlimited.
func NewBucket(perSecond int) *Bucket {
	b := &Bucket{}
	b.SetRate(perSecond)
	return b
}

// limitOf is a rate per second as a limit: 0 (or less) is unlimited.
func limitOf(perSecond int) rate.Limit {
	if perSecond <= 0 {
		return rate.Inf
	}
	return rate.Limit(perSecond)
}

// SetRate changes the rate (hot reload; called with every request, so a
// rate that did not change changes nothing). A new rate starts with a
// full second's burst, as a new bucket does.
func (b *Bucket) SetRate(perSecond int) {
	want := limitOf(perSecond)
	if cur := b.l.Load(); cur != nil && cur.Limit() == want {
		return
	}
	b.l.Store(rate.NewLimiter(want, max(perSecond, 0))) // starts full
}

// Allow takes n tokens if there are.
func (b *Bucket) Allow(n int) bool { return b.l.Load().AllowN(time.Now(), n) }

// Wait blocks until n tokens are available or ctx ends; more than a
// second's worth can never be, and is an error at once.
func (b *Bucket) Wait(ctx context.Context, n int) error { return b.l.Load().WaitN(ctx, n) }

// Global limits a rate over every instance with one Redis key per second.
type Global struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewGlobal returns a distributed limiter.
func NewGlobal(rdb redis.UniversalClient, prefix string) *Global {
	return &Global{rdb: rdb, prefix: prefix}
}

// Allow counts n in the current second and says whether it is within limit.
func (g *Global) Allow(ctx context.Context, name string, limit, n int) (bool, error) {
	if limit <= 0 {
		return true, nil
	}
	key := fmt.Sprintf("%s%s:%d", g.prefix, name, time.Now().Unix())
	pipe := g.rdb.TxPipeline()
	incr := pipe.IncrBy(ctx, key, int64(n))
	pipe.Expire(ctx, key, 5*time.Second)
	if _, err := pipe.Exec(ctx); err != nil {
		return false, err
	}
	return incr.Val() <= int64(limit), nil
}
