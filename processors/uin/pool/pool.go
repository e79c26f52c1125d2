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
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/processors/uin/internal/luascript"
	pb "surge/schemas/surgev1"
)

// Why an insertion is refused.
var (
	ErrInUse     = errors.New("uin in use")
	ErrLeased    = errors.New("uin leased to a local pool")
	ErrInPool    = errors.New("uin already in the pool")
	ErrExhausted = errors.New("pool: no uin available")
	// ErrRebuilding answers a change while the pool has no generation
	// marker: Redis lost the pool (or an operator forced a rebuild), and
	// it is being folded back from uin.pool (Rebuild).
	ErrRebuilding = errors.New("pool: the uin pool is being rebuilt from uin.pool")
)

// guardLua opens every script that changes the pool: the last key is the
// generation marker, which Rebuild sets after it wrote the pool back. A
// Redis that lost its data has none, so no change is made on a pool that
// is not there (an empty pool would hand out uins the topic says are used).
const guardLua = `
if redis.call('EXISTS', KEYS[#KEYS]) == 0 then return redis.error_reply('POOLREBUILDING the uin pool is being rebuilt from uin.pool') end
`

// rebuildingErr maps a script's guard refusal to ErrRebuilding.
func rebuildingErr(err error) error {
	if err != nil && strings.Contains(err.Error(), "POOLREBUILDING") {
		return ErrRebuilding
	}
	return err
}

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
	journal    Journal
	noBitfield atomic.Bool
}

// NewCentral returns the central pool with keys under prefix.
func NewCentral(rdb redis.UniversalClient, prefix string, buckets int) *Central {
	return &Central{rdb: rdb, prefix: prefix, buckets: max(buckets, 1)}
}

// WithJournal sets where the pool's changes are recorded before they take
// effect; without one, insertions, allocations and claims are refused
// (ErrNoJournal).
func (c *Central) WithJournal(j Journal) *Central { c.journal = j; return c }

// record writes a change to the journal.
func (c *Central) record(ctx context.Context, op pb.PoolChange_Op, reason string, uins []uint32) error {
	if c.journal == nil {
		return ErrNoJournal
	}
	return c.journal.Write(ctx, op, reason, uins)
}

// Buckets is the bucket count.
func (c *Central) Buckets() int { return c.buckets }

// Bucket is the bucket a uin belongs in (uin mod the bucket count).
func (c *Central) Bucket(uin uint32) uint32 { return uin % uint32(c.buckets) }

func (c *Central) bucket(uin uint32) string {
	return c.prefix + "bucket:" + strconv.Itoa(int(uin%uint32(c.buckets)))
}
func (c *Central) used() string           { return c.prefix + "used" }            // bitmap: an account holds the uin
func (c *Central) held() string           { return c.prefix + "held" }            // bitmap: pooled or leased
func (c *Central) gen() string            { return c.prefix + "gen" }             // the generation marker (guardLua)
func (c *Central) releaseOffsets() string { return c.prefix + "release-offsets" } // per partition of uin.pool: the last release applied

// insertScript pools uins (ARGV), each unless it is used or held; KEYS
// are the used and held bitmaps, then each uin's bucket, then the
// generation. It answers a code per uin: 1 (pooled), 0 (in use), 2
// (already in the bucket), 3 (leased).
var insertScript = redis.NewScript(guardLua + `
local codes = {}
for i, u in ipairs(ARGV) do
  local bucket = KEYS[2 + i]
  if redis.call('GETBIT', KEYS[1], u) == 1 then codes[i] = 0
  elseif redis.call('GETBIT', KEYS[2], u) == 1 then
    if redis.call('SISMEMBER', bucket, u) == 1 then codes[i] = 2 else codes[i] = 3 end
  else
    redis.call('SETBIT', KEYS[2], u, 1)
    redis.call('SADD', bucket, u)
    codes[i] = 1
  end
end
return codes`)

// insertChunk is the most uins one insertScript call pools.
const insertChunk = 500

// insert runs insertScript over the uins in one pipeline, a call per
// insertChunk of them (each uin is checked and pooled atomically, as is
// each call).
func (c *Central) insert(ctx context.Context, uins []uint32) ([]int, error) {
	if len(uins) == 0 {
		return nil, nil
	}
	var out []int
	err := luascript.Pipelined(ctx, c.rdb, insertScript, func() (err error) {
		out, err = c.insertOnce(ctx, uins)
		return err
	})
	return out, err
}

func (c *Central) insertOnce(ctx context.Context, uins []uint32) ([]int, error) {
	pipe := c.rdb.Pipeline()
	var cmds []*redis.Cmd
	for lo := 0; lo < len(uins); lo += insertChunk {
		chunk := uins[lo:min(lo+insertChunk, len(uins))]
		keys := append(make([]string, 0, 3+len(chunk)), c.used(), c.held())
		args := make([]any, len(chunk))
		for i, u := range chunk {
			keys, args[i] = append(keys, c.bucket(u)), u
		}
		cmds = append(cmds, insertScript.EvalSha(ctx, pipe, append(keys, c.gen()), args...))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, rebuildingErr(err)
	}
	out := make([]int, 0, len(uins))
	for _, cmd := range cmds {
		codes, err := cmd.Int64Slice()
		if err != nil {
			return nil, rebuildingErr(err)
		}
		for _, code := range codes {
			out = append(out, int(code))
		}
	}
	return out, nil
}

// Insert adds uins to the pool; errs[i] says why uins[i] was refused.
// Each uin is checked and added atomically, after the insertion is on
// the journal.
func (c *Central) Insert(ctx context.Context, uins []uint32) ([]error, error) {
	if err := c.record(ctx, pb.PoolChange_INSERT, "", uins); err != nil {
		return nil, err
	}
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
// this call's own earlier attempt, repeated after an aborted batch. It
// journals nothing: the recycle controller's INSERT records commit with
// its batch (Fold says why that order is safe).
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

// getBits reads the uins' bits in key, with BITFIELD, a thousand per
// command.
func (c *Central) getBits(ctx context.Context, key string, uins []uint32) ([]bool, error) {
	out := make([]bool, len(uins))
	if len(uins) == 0 {
		return out, nil
	}
	pipe := c.rdb.Pipeline()
	if c.noBitfield.Load() {
		cmds := make([]*redis.IntCmd, len(uins))
		for i, u := range uins {
			cmds[i] = pipe.GetBit(ctx, key, int64(u))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, err
		}
		for i, cmd := range cmds {
			out[i] = cmd.Val() == 1
		}
		return out, nil
	}
	cmds := bitfields(ctx, pipe, key, uins, func(args []any, u uint32) []any { return append(args, "GET", "u1", u) })
	_, err := pipe.Exec(ctx)
	if c.lacksBitfield(err) {
		return c.getBits(ctx, key, uins)
	}
	if err != nil {
		return nil, err
	}
	i := 0
	for _, cmd := range cmds {
		for _, v := range cmd.Val() {
			out[i] = v == 1
			i++
		}
	}
	return out, nil
}

// bitfieldChunk is the most uins one BITFIELD command names.
const bitfieldChunk = 1000

// bitfields queues on pipe a BITFIELD command on key per bitfieldChunk
// uins, op appending each uin's operation to the command's arguments.
func bitfields(ctx context.Context, pipe redis.Pipeliner, key string, uins []uint32, op func(args []any, u uint32) []any) []*redis.IntSliceCmd {
	var cmds []*redis.IntSliceCmd
	for lo := 0; lo < len(uins); lo += bitfieldChunk {
		chunk := uins[lo:min(lo+bitfieldChunk, len(uins))]
		args := make([]any, 0, 4*len(chunk))
		for _, u := range chunk {
			args = op(args, u)
		}
		cmds = append(cmds, pipe.BitField(ctx, key, args...))
	}
	return cmds
}

// lacksBitfield reports whether err says the server has no BITFIELD (a
// miniredis), and if so remembers it: the callers go on with one
// SETBIT/GETBIT per uin.
func (c *Central) lacksBitfield(err error) bool {
	if err == nil || c.noBitfield.Load() || !strings.Contains(err.Error(), "unknown command") {
		return false
	}
	c.noBitfield.Store(true)
	return true
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
// compare-and-set; it is idempotent. A uin that is pooled or leased (held
// and not used) keeps its bits: no account can hold it, so the deletion is
// of an account recycled before, and clearing the held bit would let it
// into a bucket a second time while a local pool holds it. It returns the
// uins it left alone.
func (c *Central) Free(ctx context.Context, uins ...uint32) (kept []uint32, err error) {
	if len(uins) == 0 {
		return nil, nil
	}
	var codes []int64
	err = luascript.Pipelined(ctx, c.rdb, freeScript, func() error {
		pipe := c.rdb.Pipeline()
		var cmds []*redis.Cmd
		for lo := 0; lo < len(uins); lo += freeChunk {
			chunk := uins[lo:min(lo+freeChunk, len(uins))]
			args := make([]any, len(chunk))
			for i, u := range chunk {
				args[i] = u
			}
			cmds = append(cmds, freeScript.EvalSha(ctx, pipe, []string{c.used(), c.held(), c.gen()}, args...))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return rebuildingErr(err)
		}
		codes = codes[:0]
		for _, cmd := range cmds {
			cs, err := cmd.Int64Slice()
			if err != nil {
				return rebuildingErr(err)
			}
			codes = append(codes, cs...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, code := range codes {
		if code == 0 {
			kept = append(kept, uins[i])
		}
	}
	return kept, nil
}

// freeChunk is the most uins one freeScript call frees.
const freeChunk = 1000

// freeScript clears the used and held bits (KEYS) of each uin (ARGV)
// unless it is pooled or leased (held, not used); 1 freed, 0 left alone.
// Its FREE records commit with the controller's batch.
var freeScript = redis.NewScript(guardLua + `
local codes = {}
for i, u in ipairs(ARGV) do
  if redis.call('GETBIT', KEYS[1], u) == 0 and redis.call('GETBIT', KEYS[2], u) == 1 then
    codes[i] = 0
  else
    redis.call('SETBIT', KEYS[1], u, 0)
    redis.call('SETBIT', KEYS[2], u, 0)
    codes[i] = 1
  end
end
return codes`)

// Status reports, per uin, whether it is in use, in one round trip.
func (c *Central) Status(ctx context.Context, uins []uint32) (used []bool, err error) {
	return c.getBits(ctx, c.used(), uins)
}

// Claim takes a uin for an account outside allocation (the restore tool
// giving a user back the old uin): it succeeds when no account holds it
// and no local pool has it, taking it out of its bucket if it was pooled,
// and marks it used. A false answer means the uin was reused. A claim is
// journaled (ALLOCATE) before it is answered.
func (c *Central) Claim(ctx context.Context, uin uint32) (bool, error) {
	if c.journal == nil {
		return false, ErrNoJournal
	}
	n, err := claimScript.Run(ctx, c.rdb, []string{c.used(), c.held(), c.bucket(uin), c.gen()}, uin).Int()
	if err != nil {
		return false, rebuildingErr(err)
	}
	if n == 1 {
		if err := c.record(ctx, pb.PoolChange_ALLOCATE, "claimed", []uint32{uin}); err != nil {
			return false, err
		}
	}
	return n == 1, nil
}

// claimLua claims ARGV[1] (KEYS: used, held, its bucket): not when an
// account holds it, nor when it is pooled or leased and not in its bucket
// (a lease has it); else out of the bucket and marked used. %s is what a
// refused claim returns. Claim and ClaimFor share it.
const claimLua = `
if redis.call('GETBIT', KEYS[1], ARGV[1]) == 1 then return %[1]s end
if redis.call('GETBIT', KEYS[2], ARGV[1]) == 1 and redis.call('SREM', KEYS[3], ARGV[1]) == 0 then return %[1]s end
redis.call('SETBIT', KEYS[2], ARGV[1], 0)
redis.call('SETBIT', KEYS[1], ARGV[1], 1)
`

var claimScript = redis.NewScript(guardLua + fmt.Sprintf(claimLua, "0") + "return 1")

// Intents record what a one-off claim decided (a restore's uin), under a
// key naming the claim: the decision and the claim are one script, so a
// claim run again after a crash (its first run's effect kept, its answer
// lost) finds the decision instead of claiming a second uin.

// Decided returns the uin recorded under intent, or -1 when none is.
func (c *Central) Decided(ctx context.Context, intent string) (int64, error) {
	v, err := c.rdb.Get(ctx, intent).Int64()
	if errors.Is(err, redis.Nil) {
		return -1, nil
	}
	return v, err
}

// ClaimFor claims uin (as Claim) and records it under intent, unless
// intent holds a decision already, which it returns. -1: uin is not free
// and nothing was decided.
func (c *Central) ClaimFor(ctx context.Context, intent string, uin uint32, ttl time.Duration) (int64, error) {
	if c.journal == nil {
		return -1, ErrNoJournal
	}
	v, err := claimForScript.Run(ctx, c.rdb, []string{c.used(), c.held(), c.bucket(uin), intent, c.gen()}, uin, ttl.Milliseconds()).Int64()
	if err != nil {
		return -1, rebuildingErr(err)
	}
	if v >= 0 { // again for a repeated decision: a change counts once however often it is on the topic
		if err := c.record(ctx, pb.PoolChange_ALLOCATE, "claimed", []uint32{uint32(v)}); err != nil {
			return -1, err
		}
	}
	return v, nil
}

var claimForScript = redis.NewScript(guardLua + `
local d = redis.call('GET', KEYS[4])
if d then return tonumber(d) end` + fmt.Sprintf(claimLua, "-1") + `
redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
return tonumber(ARGV[1])`)

// TakeFor hands out one uin straight from the central pool, marked used,
// and records it under intent, unless intent holds a decision already: a
// one-off allocation outside the allocators (a restore), which must not
// strand a leased chunk.
func (c *Central) TakeFor(ctx context.Context, intent string, rng *rand.Rand, ttl time.Duration) (uint32, error) {
	if c.journal == nil {
		return 0, ErrNoJournal
	}
	order := rng.Perm(c.buckets)
	const per = 32 // buckets tried per script run
	for i := 0; i < len(order); i += per {
		keys := []string{intent, c.used()}
		for _, b := range order[i:min(i+per, len(order))] {
			keys = append(keys, c.prefix+"bucket:"+strconv.Itoa(b))
		}
		v, err := takeForScript.Run(ctx, c.rdb, append(keys, c.gen()), ttl.Milliseconds()).Int64()
		if err != nil {
			return 0, rebuildingErr(err)
		}
		if v >= 0 {
			if err := c.record(ctx, pb.PoolChange_ALLOCATE, "claimed", []uint32{uint32(v)}); err != nil {
				return 0, err
			}
			return uint32(v), nil
		}
	}
	return 0, ErrExhausted
}

var takeForScript = redis.NewScript(guardLua + `
local d = redis.call('GET', KEYS[1])
if d then return tonumber(d) end
for i = 3, #KEYS - 1 do
  local v = redis.call('SPOP', KEYS[i])
  if v then
    redis.call('SETBIT', KEYS[2], v, 1)
    redis.call('SET', KEYS[1], v, 'PX', ARGV[1])
    return tonumber(v)
  end
end
return -1`)

// InUse reports whether uin is marked in use.
func (c *Central) InUse(ctx context.Context, uin uint32) (bool, error) {
	n, err := c.rdb.GetBit(ctx, c.used(), int64(uin)).Result()
	return n == 1, err
}

// ReleaseOutcome is what became of a released uin.
type ReleaseOutcome int

const (
	Released       ReleaseOutcome = 1 // back in its bucket
	ReleaseHeld    ReleaseOutcome = 0 // an account holds it: refused
	ReleaseRepeat  ReleaseOutcome = 2 // this release record was applied before
	ReleaseNotUsed ReleaseOutcome = 3 // not allocated: nothing to give back
)

// releaseScript gives back an allocated uin unless an account (KEYS[3])
// holds it. Applying it records the release record's offset (ARGV[3]) for
// its partition (ARGV[2]) in KEYS[4] in the same step, so a record applied
// once and consumed again after a crash is not applied again: the uin may
// by then be allocated to someone else.
var releaseScript = redis.NewScript(guardLua + `
local last = tonumber(redis.call('HGET', KEYS[4], ARGV[2]) or '-1')
if tonumber(ARGV[3]) <= last then return 2 end
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('GETBIT', KEYS[1], ARGV[1]) == 0 then return 3 end
redis.call('SETBIT', KEYS[1], ARGV[1], 0)
redis.call('SADD', KEYS[2], ARGV[1])
return 1`)

// Release pools again a uin allocated and never used (its registration
// was abandoned), applying the release record at partition/offset of
// its topic once; accountKey is the account store's key for the uin.
func (c *Central) Release(ctx context.Context, uin uint32, accountKey string, partition int32, offset int64) (ReleaseOutcome, error) {
	n, err := releaseScript.Run(ctx, c.rdb, []string{c.used(), c.bucket(uin), accountKey, c.releaseOffsets(), c.gen()},
		uin, partition, offset).Int()
	return ReleaseOutcome(n), rebuildingErr(err)
}
