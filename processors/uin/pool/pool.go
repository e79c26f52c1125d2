// Package pool hands out uins (32-bit account numbers) from a central pool
// in Redis and per-allocator local pools. The central pool is split into
// buckets by uin mod bucket count (seed: 1,000) so no one key is hot;
// an allocator whose local pool runs low pulls a chunk from a random
// bucket with SPOP, which removes the uins atomically: a uin leaves the
// central pool once, into exactly one local pool, and is handed out once.
// Allocation from the local pool is a slice pop, no I/O. Insertion refuses
// a uin that is in use, leased to a local pool, or already pooled.
package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Why an insertion is refused.
var (
	ErrInUse     = errors.New("uin in use")
	ErrLeased    = errors.New("uin leased to a local pool")
	ErrInPool    = errors.New("uin already in the pool")
	ErrExhausted = errors.New("pool: no uin available")
)

// Central is the pool in Redis. Two bitmaps over the uin space say where a
// uin is: "used" (an account holds it) and "held" (the pool holds it:
// pooled in a bucket, or leased to a local pool). The held bit is set when
// a uin is inserted, before it enters its bucket, and stays while it is
// leased and allocated, so a lease is a plain SPOP and no moment exists at
// which a pooled or leased uin looks free to an insertion. Deleting the
// account (Free) clears both.
type Central struct {
	rdb        redis.UniversalClient
	prefix     string
	buckets    int
	noBitfield atomic.Bool
}

// NewCentral returns the central pool with keys under prefix.
func NewCentral(rdb redis.UniversalClient, prefix string, buckets int) *Central {
	return &Central{rdb: rdb, prefix: prefix, buckets: max(buckets, 1)}
}

func (c *Central) bucket(uin uint32) string {
	return c.prefix + "bucket:" + strconv.Itoa(int(uin%uint32(c.buckets)))
}
func (c *Central) used() string { return c.prefix + "used" } // bitmap: an account holds the uin
func (c *Central) held() string { return c.prefix + "held" } // bitmap: pooled or leased

// insertScript pools one uin unless it is used or held; it answers 1
// (pooled), 0 (in use), 2 (already in the bucket), 3 (leased).
var insertScript = redis.NewScript(`
if redis.call('GETBIT', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('GETBIT', KEYS[2], ARGV[1]) == 1 then
  if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 2 end
  return 3
end
redis.call('SETBIT', KEYS[2], ARGV[1], 1)
redis.call('SADD', KEYS[3], ARGV[1])
return 1`)

// insert runs insertScript for each uin in one pipeline.
func (c *Central) insert(ctx context.Context, uins []uint32) ([]int, error) {
	if len(uins) == 0 {
		return nil, nil
	}
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(uins))
	for i, u := range uins {
		cmds[i] = insertScript.Eval(ctx, pipe, []string{c.used(), c.held(), c.bucket(u)}, u)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]int, len(uins))
	for i, cmd := range cmds {
		out[i], _ = cmd.Int()
	}
	return out, nil
}

// Insert adds uins to the pool; errs[i] says why uins[i] was refused.
// Each uin is checked and added atomically.
func (c *Central) Insert(ctx context.Context, uins []uint32) ([]error, error) {
	codes, err := c.insert(ctx, uins)
	if err != nil {
		return nil, err
	}
	errs := make([]error, len(uins))
	for i, code := range codes {
		switch code {
		case 0:
			errs[i] = fmt.Errorf("%w: %d", ErrInUse, uins[i])
		case 2:
			errs[i] = fmt.Errorf("%w: %d", ErrInPool, uins[i])
		case 3:
			errs[i] = fmt.Errorf("%w: %d", ErrLeased, uins[i])
		}
	}
	return errs, nil
}

// InsertIfFree pools the uins of finished recycle tickets in one round
// trip and returns those refused because an account holds them (a restore
// took them back). A uin the pool already holds counts as pooled: it is
// this call's own earlier attempt, repeated after an aborted batch.
func (c *Central) InsertIfFree(ctx context.Context, uins []uint32) ([]uint32, error) {
	codes, err := c.insert(ctx, uins)
	if err != nil {
		return nil, err
	}
	var refused []uint32
	for i, code := range codes {
		if code == 0 {
			refused = append(refused, uins[i])
		}
	}
	return refused, nil
}

// lease pulls up to n uins from random buckets: one pipeline of SPOPs over
// 16 random buckets, and over every bucket when those were empty (a pool
// running dry), so a lease is one or two round trips however empty the
// pool gets. The uins stay marked held.
func (c *Central) lease(ctx context.Context, n int, rng *rand.Rand) ([]uint32, error) {
	pick := make([]int, 0, 16)
	for range min(16, c.buckets) {
		pick = append(pick, rng.IntN(c.buckets))
	}
	out, err := c.spop(ctx, pick, max(n/len(pick), 1))
	if err != nil || len(out) > 0 {
		return out, err
	}
	all := make([]int, c.buckets)
	for b := range all {
		all[b] = b
	}
	out, err = c.spop(ctx, all, max(n/c.buckets, 1))
	if err == nil && len(out) == 0 {
		err = ErrExhausted
	}
	return out, err
}

func (c *Central) spop(ctx context.Context, buckets []int, each int) ([]uint32, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, len(buckets))
	for i, b := range buckets {
		cmds[i] = pipe.SPopN(ctx, c.prefix+"bucket:"+strconv.Itoa(b), int64(each))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var out []uint32
	for _, cmd := range cmds {
		for _, v := range cmd.Val() {
			if u, err := strconv.ParseUint(v, 10, 32); err == nil {
				out = append(out, uint32(u))
			}
		}
	}
	return out, nil
}

// markUsed records allocations in the used bitmap.
func (c *Central) markUsed(ctx context.Context, uins []uint32) error {
	return c.setBits(ctx, c.used(), uins)
}

// setBits sets bits with BITFIELD, a thousand per command: one command
// object per thousand uins, not one per uin.
func (c *Central) setBits(ctx context.Context, key string, uins []uint32) error {
	if c.noBitfield.Load() {
		pipe := c.rdb.Pipeline()
		for _, u := range uins {
			pipe.SetBit(ctx, key, int64(u), 1)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	pipe := c.rdb.Pipeline()
	for lo := 0; lo < len(uins); lo += 1000 {
		hi := min(lo+1000, len(uins))
		args := make([]any, 0, 4*(hi-lo))
		for _, u := range uins[lo:hi] {
			args = append(args, "SET", "u1", u, 1)
		}
		pipe.BitField(ctx, key, args...)
	}
	_, err := pipe.Exec(ctx)
	if err != nil && strings.Contains(err.Error(), "unknown command") {
		c.noBitfield.Store(true) // a Redis without BITFIELD (miniredis)
		return c.setBits(ctx, key, uins)
	}
	return err
}

// Size is the number of uins in the central pool.
func (c *Central) Size(ctx context.Context) (int64, error) {
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, c.buckets)
	for b := range c.buckets {
		cmds[b] = pipe.SCard(ctx, c.prefix+"bucket:"+strconv.Itoa(b))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}

// Free records that the accounts on uins are deleted: the uins are
// neither in use nor held, so a later insertion may pool them. Only the
// recycle controller calls it, after its DELETE step won the
// compare-and-set; it is idempotent.
func (c *Central) Free(ctx context.Context, uins ...uint32) error {
	pipe := c.rdb.Pipeline()
	for _, u := range uins {
		pipe.SetBit(ctx, c.used(), int64(u), 0)
		pipe.SetBit(ctx, c.held(), int64(u), 0)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// Status reports, per uin, whether it is in use, in one round trip.
func (c *Central) Status(ctx context.Context, uins []uint32) (used []bool, err error) {
	pipe := c.rdb.Pipeline()
	u := make([]*redis.IntCmd, len(uins))
	for i, x := range uins {
		u[i] = pipe.GetBit(ctx, c.used(), int64(x))
	}
	if len(uins) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, err
		}
	}
	used = make([]bool, len(uins))
	for i := range uins {
		used[i] = u[i].Val() == 1
	}
	return used, nil
}

// Claim takes a uin for an account outside allocation (the restore tool
// giving a user back the old uin): it succeeds when no account holds it
// and no local pool has it, taking it out of its bucket if it was pooled,
// and marks it used. A false answer means the uin was reused.
func (c *Central) Claim(ctx context.Context, uin uint32) (bool, error) {
	n, err := claimScript.Run(ctx, c.rdb, []string{c.used(), c.held(), c.bucket(uin)}, uin).Int()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

var claimScript = redis.NewScript(`
if redis.call('GETBIT', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('GETBIT', KEYS[2], ARGV[1]) == 1 and redis.call('SREM', KEYS[3], ARGV[1]) == 0 then return 0 end
redis.call('SETBIT', KEYS[2], ARGV[1], 0)
redis.call('SETBIT', KEYS[1], ARGV[1], 1)
return 1`)

// TakeOne hands out one uin straight from the central pool, marked used,
// for a one-off allocation outside the allocators (the restore tool),
// which must not strand a leased chunk.
func (c *Central) TakeOne(ctx context.Context, rng *rand.Rand) (uint32, error) {
	for _, b := range rng.Perm(c.buckets) {
		v, err := c.rdb.SPop(ctx, c.prefix+"bucket:"+strconv.Itoa(b)).Uint64()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return 0, err
		}
		return uint32(v), c.setBits(ctx, c.used(), []uint32{uint32(v)})
	}
	return 0, ErrExhausted
}

// InUse reports whether uin is marked in use.
func (c *Central) InUse(ctx context.Context, uin uint32) (bool, error) {
	n, err := c.rdb.GetBit(ctx, c.used(), int64(uin)).Result()
	return n == 1, err
}

// Allocator is a stateless allocator's local pool: what it holds is only
// a lease, and its allocations are recorded in Redis in the background.
type Allocator struct {
	c          *Central
	low, chunk int
	rng        *rand.Rand

	mu      sync.Mutex
	local   []uint32
	pending []uint32 // allocated, not yet marked used
	filling atomic.Bool
	refill  chan struct{}
	// Allocated counts allocations.
	Allocated atomic.Int64
}

// NewAllocator returns a local pool that pulls chunk uins when it holds
// fewer than low; Run must be running for refills and used marks.
func NewAllocator(c *Central, low, chunk int, seed uint64) *Allocator {
	return &Allocator{c: c, low: low, chunk: chunk, rng: rand.New(rand.NewPCG(seed, seed^0x9e37)), refill: make(chan struct{}, 1)}
}

// Run refills the local pool and flushes used marks until ctx ends, then
// flushes once more.
func (a *Allocator) Run(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	if err := a.fill(ctx); err != nil && !errors.Is(err, ErrExhausted) {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return a.flush(context.WithoutCancel(ctx))
		case <-a.refill:
			if err := a.fill(ctx); err != nil && !errors.Is(err, ErrExhausted) && ctx.Err() == nil {
				return err
			}
		case <-t.C:
			if err := a.flush(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// fill leases until the local pool holds at least low uins (or the
// central pool is dry).
func (a *Allocator) fill(ctx context.Context) error {
	for {
		a.mu.Lock()
		need := len(a.local) < a.low
		a.mu.Unlock()
		if !need {
			return nil
		}
		uins, err := a.c.lease(ctx, a.chunk, a.rng)
		if err != nil {
			return err
		}
		a.mu.Lock()
		a.local = append(a.local, uins...)
		a.mu.Unlock()
	}
}

func (a *Allocator) flush(ctx context.Context) error {
	a.mu.Lock()
	batch := a.pending
	a.pending = nil
	a.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	if err := a.c.markUsed(ctx, batch); err != nil {
		a.mu.Lock()
		a.pending = append(a.pending, batch...)
		a.mu.Unlock()
		return err
	}
	return nil
}

// Allocate hands out one uin from the local pool.
func (a *Allocator) Allocate() (uint32, error) {
	a.mu.Lock()
	n := len(a.local)
	if n == 0 {
		a.mu.Unlock()
		a.kick()
		return 0, ErrExhausted
	}
	u := a.local[n-1]
	a.local = a.local[:n-1]
	a.pending = append(a.pending, u)
	low := n-1 < a.low
	a.mu.Unlock()
	a.Allocated.Add(1)
	if low {
		a.kick()
	}
	return u, nil
}

func (a *Allocator) kick() {
	select {
	case a.refill <- struct{}{}:
	default:
	}
}

// Held is the number of uins in the local pool.
func (a *Allocator) Held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.local)
}
