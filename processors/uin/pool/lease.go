package pool

// Leases: the central pool's uins leased to an allocator, committed as
// used, returned by a graceful stop, swept when their owner lapsed.

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	pb "surge/schemas/surgev1"
)

func (c *Central) leaseKey(owner string) string { return c.prefix + "lease:" + owner }
func (c *Central) aliveKey(owner string) string { return c.prefix + "alive:" + owner }
func (c *Central) leasesKey() string            { return c.prefix + "leases" }
func (c *Central) returningKey() string         { return c.prefix + "returning" } // leases being returned
func (c *Central) bucketPrefix() string         { return c.prefix + "bucket:" }

// leaseScript pops up to ARGV[1] uins from each bucket in KEYS[3:], and
// ARGV[3] in all, and records them in the lease set KEYS[1] of owner
// ARGV[2] (listed in KEYS[2]), atomically: no moment exists at which a uin
// is in neither. The last key is the generation, answered first. (The
// bound matters in a sparse pool, where a lease walks every bucket: a
// leased uin counts as allocated until its lease is returned, so a big
// lease is what a Redis loss would strand.)
var leaseScript = redis.NewScript(guardLua + `
local out = {redis.call('GET', KEYS[#KEYS])}
local want = tonumber(ARGV[3])
for i = 3, #KEYS - 1 do
  local room = want - (#out - 1)
  if room <= 0 then break end
  local xs = redis.call('SPOP', KEYS[i], math.min(tonumber(ARGV[1]), room))
  for _, x in ipairs(xs) do out[#out+1] = x end
end
for i = 2, #out, 1000 do
  redis.call('SADD', KEYS[1], unpack(out, i, math.min(i + 999, #out)))
end
if #out > 1 then redis.call('SADD', KEYS[2], ARGV[2]) end
return out`)

// commitScript hands out the uins in ARGV[2:] that are still in the lease
// set KEYS[1], marking them used in KEYS[2]; it returns those. ARGV[1] is
// the generation the lease was taken in: in another (a rebuilt pool) the
// lease is gone, and the commit is refused whole.
var commitScript = redis.NewScript(guardLua + `
if redis.call('GET', KEYS[#KEYS]) ~= ARGV[1] then return redis.error_reply('POOLREBUILDING a lease of an earlier pool generation') end
local ok = {}
for i = 2, #ARGV do
  if redis.call('SREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('SETBIT', KEYS[2], ARGV[i], 1)
    ok[#ok+1] = ARGV[i]
  end
end
return ok`)

// uncommitScript undoes commitScript for uins (ARGV) that no caller
// received: each still marked used in KEYS[2] goes back into the lease set
// KEYS[1], unmarked, to be handed out again; it returns those.
var uncommitScript = redis.NewScript(guardLua + `
local back = {}
for i = 1, #ARGV do
  if redis.call('GETBIT', KEYS[2], ARGV[i]) == 1 then
    redis.call('SETBIT', KEYS[2], ARGV[i], 0)
    redis.call('SADD', KEYS[1], ARGV[i])
    back[#back+1] = ARGV[i]
  end
end
return back`)

// fenceScript takes owner ARGV[1]'s lease set KEYS[1] away from it,
// renaming it to the returning set KEYS[3] (listed in KEYS[4]) and
// dropping the owner from the owners KEYS[5], unless the owner is alive
// (ARGV[2] is '1' and KEYS[2] holds a heartbeat deadline past ARGV[3], the
// sweeper's clock in ms; answer -1). From then on the owner can commit
// none of those uins (its commits take from KEYS[1]), so the uins can be
// journaled as given back before they go back to their buckets. It
// answers how many uins it took.
var fenceScript = redis.NewScript(guardLua + `
if ARGV[2] == '1' then
  local alive = tonumber(redis.call('GET', KEYS[2]) or '0')
  if alive > tonumber(ARGV[3]) then return -1 end
end
redis.call('SREM', KEYS[5], ARGV[1])
local n = redis.call('SCARD', KEYS[1])
if n == 0 then return 0 end
redis.call('RENAME', KEYS[1], KEYS[3])
redis.call('SADD', KEYS[4], KEYS[3])
return n`)

// unfenceScript sends up to ARGV[3] uins of the returning set KEYS[1] back
// to their buckets (ARGV[1] .. uin % ARGV[2]); a uin used meanwhile (KEYS[2])
// stays out. It drops the set from the list KEYS[3] once it is empty.
var unfenceScript = redis.NewScript(guardLua + `
local xs = redis.call('SPOP', KEYS[1], ARGV[3])
local back = 0
for _, x in ipairs(xs) do
  if redis.call('GETBIT', KEYS[2], x) == 0 then
    redis.call('SADD', ARGV[1] .. (tonumber(x) % tonumber(ARGV[2])), x)
    back = back + 1
  end
end
if redis.call('SCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[3], KEYS[1]) end
return back`)

// lease pulls up to n uins into owner's lease: one script over 16 random
// buckets, and over every bucket when those were empty (a pool running
// dry), so a lease is one or two round trips however empty the pool gets.
func (c *Central) lease(ctx context.Context, owner string, n int, rng *rand.Rand) ([]uint32, string, error) {
	pick := make([]int, 0, 16)
	for range min(16, c.buckets) {
		pick = append(pick, rng.IntN(c.buckets))
	}
	out, gen, err := c.leaseFrom(ctx, owner, pick, max(n/len(pick), 1), n)
	if err != nil || len(out) > 0 {
		return out, gen, err
	}
	// Every bucket, in a random order: with the lease bounded to n, the
	// instances must not all drain the same first buckets.
	out, gen, err = c.leaseFrom(ctx, owner, rng.Perm(c.buckets), max(n/c.buckets, 1), n)
	if err == nil && len(out) == 0 {
		err = ErrExhausted
	}
	return out, gen, err
}

// leaseFrom answers the uins leased and the pool's generation.
func (c *Central) leaseFrom(ctx context.Context, owner string, buckets []int, each, total int) ([]uint32, string, error) {
	keys := make([]string, 0, 3+len(buckets))
	keys = append(keys, c.leaseKey(owner), c.leasesKey())
	for _, b := range buckets {
		keys = append(keys, c.bucketPrefix()+strconv.Itoa(b))
	}
	vals, err := leaseScript.Run(ctx, c.rdb, append(keys, c.gen()), each, owner, max(total, 1)).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, "", rebuildingErr(err)
	}
	if len(vals) == 0 {
		return nil, "", ErrRebuilding
	}
	return parseUins(vals[1:]), vals[0], nil
}

// commit hands out the uins still in owner's lease taken in generation
// gen.
func (c *Central) commit(ctx context.Context, owner, gen string, uins []uint32) ([]uint32, error) {
	return c.leaseScript(ctx, commitScript, owner, []any{gen}, uins)
}

// uncommit puts uins committed for owner, and received by nobody, back
// into its lease.
func (c *Central) uncommit(ctx context.Context, owner string, uins []uint32) ([]uint32, error) {
	return c.leaseScript(ctx, uncommitScript, owner, nil, uins)
}

// leaseScript runs script on owner's lease, the used set and the
// generation with args and then uins as arguments, and returns the uins
// it answers.
func (c *Central) leaseScript(ctx context.Context, script *redis.Script, owner string, args []any, uins []uint32) ([]uint32, error) {
	for _, u := range uins {
		args = append(args, u)
	}
	vals, err := script.Run(ctx, c.rdb, []string{c.leaseKey(owner), c.used(), c.gen()}, args...).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, rebuildingErr(err)
	}
	return parseUins(vals), nil
}

// ReturnLease sends owner's uncommitted lease back to the buckets; with
// onlyLapsed it does nothing while the owner's heartbeat is alive. The
// lease is first taken from the owner (it can commit none of it after),
// then journaled as given back, then pooled: a rebuild never finds a uin
// pooled that its journal says is leased. It answers how many uins went
// back.
func (c *Central) ReturnLease(ctx context.Context, owner string, onlyLapsed bool) (int, error) {
	guard := "0"
	if onlyLapsed {
		guard = "1"
	}
	returning := c.prefix + "returning:" + owner + ":" + strconv.FormatUint(rand.Uint64(), 36)
	keys := []string{c.leaseKey(owner), c.aliveKey(owner), returning, c.returningKey(), c.leasesKey(), c.gen()}
	n, err := fenceScript.Run(ctx, c.rdb, keys, owner, guard, time.Now().UnixMilli()).Int()
	if err != nil || n <= 0 {
		return 0, rebuildingErr(err)
	}
	return c.unfence(ctx, returning)
}

// unfence journals a returning set's uins as given back and pools them.
func (c *Central) unfence(ctx context.Context, returning string) (int, error) {
	members, err := c.rdb.SMembers(ctx, returning).Result()
	if err != nil {
		return 0, err
	}
	if err := c.record(ctx, pb.PoolChange_GIVEN_BACK, "lease returned", parseUins(members)); err != nil {
		return 0, err // the set stays listed: the next sweep tries again
	}
	total := 0
	for {
		n, err := unfenceScript.Run(ctx, c.rdb, []string{returning, c.used(), c.returningKey(), c.gen()}, c.bucketPrefix(), c.buckets, 5000).Int()
		if err != nil {
			return total, rebuildingErr(err)
		}
		total += n
		if left, err := c.rdb.SCard(ctx, returning).Result(); err != nil || left == 0 {
			return total, err
		}
	}
}

// SweepLapsed returns the leases of every owner whose heartbeat lapsed,
// and finishes returns a sweeper died in the middle of.
func (c *Central) SweepLapsed(ctx context.Context) (int, error) {
	owners, err := c.rdb.SMembers(ctx, c.leasesKey()).Result()
	if err != nil {
		return 0, err
	}
	total := 0
	for _, o := range owners {
		n, err := c.ReturnLease(ctx, o, true)
		if err != nil {
			return total, err
		}
		total += n
	}
	left, err := c.rdb.SMembers(ctx, c.returningKey()).Result()
	if err != nil {
		return total, err
	}
	for _, r := range left {
		n, err := c.unfence(ctx, r)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// Leased is the number of uins in every owner's lease (pulled from the
// buckets, not yet handed out).
func (c *Central) Leased(ctx context.Context) (int64, error) {
	owners, err := c.rdb.SMembers(ctx, c.leasesKey()).Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, o := range owners {
		k, err := c.rdb.SCard(ctx, c.leaseKey(o)).Result()
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

func parseUins(vals []string) []uint32 {
	out := make([]uint32, 0, len(vals))
	for _, v := range vals {
		if u, err := strconv.ParseUint(v, 10, 32); err == nil {
			out = append(out, uint32(u))
		}
	}
	return out
}
