package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	pb "surge/schemas/surgev1"
	"surge/streams/admission"
)

// Allocator is one allocation service's local pool. Every uin it pulls
// from the central pool is also recorded in its lease set in Redis
// (lease:<owner>), in the same script that pops it from its bucket, and a
// uin is handed out only after a second script took it out of the lease
// set and marked it used. So:
//   - a uin is handed out at most once: only the script that removes it
//     from the lease set may mark it used and return it;
//   - a crash strands nothing: the lease set of an owner whose heartbeat
//     (alive:<owner>) lapsed goes back to the buckets, returned by any
//     allocator's sweep, and a uin it held but had not committed can no
//     longer be committed by it.
//
// An owner name is fresh per process (NewAllocator adds a random suffix),
// so a restarted instance never mistakes its predecessor's lease for its
// own; the predecessor's lease returns once its heartbeat lapses.
type Allocator struct {
	c     *Central
	owner string
	o     allocOptions

	mu     sync.Mutex
	local  []uint32
	filled chan struct{} // closed and replaced after each refill

	refill  chan struct{}
	commits chan *commitReq
	stopped chan struct{} // closed when the commit loop is gone
	// Allocated counts uins handed out.
	Allocated atomic.Int64
	// Returned counts uins of lapsed leases this allocator sent back.
	Returned atomic.Int64
	// dry is set when the last refill found the central pool empty.
	dry atomic.Bool
	// wanted is what waiting calls still need: a refill pulls at least
	// that, so a burst is served in a refill or two, not a chunk at a time.
	wanted atomic.Int64
	// gen is the pool generation the local pool was leased in; a commit
	// in another is refused (the pool was rebuilt: the lease is gone).
	gen atomic.Pointer[string]
	// rebuilding is set while the central pool is being rebuilt.
	rebuilding atomic.Bool
	// journalFailed is set while refills cannot journal their leases.
	journalFailed atomic.Bool
}

type allocOptions struct {
	low, chunk int
	ttl        time.Duration
	seed       uint64
	refillWait time.Duration
}

// AllocatorOption configures an Allocator.
type AllocatorOption func(*allocOptions)

// LowWater makes the allocator refill when it holds fewer than n uins.
func LowWater(n int) AllocatorOption { return func(o *allocOptions) { o.low = max(n, 1) } }

// Chunk is how many uins one refill pulls from the central pool.
func Chunk(n int) AllocatorOption { return func(o *allocOptions) { o.chunk = max(n, 1) } }

// LeaseTTL is how long a lease outlives its owner's last heartbeat (the
// heartbeat runs at a third of it); default 10 s.
func LeaseTTL(d time.Duration) AllocatorOption { return func(o *allocOptions) { o.ttl = d } }

// RefillWait is how long an allocation waits for refills while the local
// pool is empty and the central pool is not (default 2 s): under a burst
// the local pool runs out before a refill lands, and "exhausted" would be
// wrong while the central pool holds millions.
func RefillWait(d time.Duration) AllocatorOption { return func(o *allocOptions) { o.refillWait = d } }

// Seed fixes the bucket choice (tests).
func Seed(s uint64) AllocatorOption { return func(o *allocOptions) { o.seed = s } }

type commitReq struct {
	ctx  context.Context // the caller's: one gone before its commit is not committed
	uins []uint32
	ok   chan []uint32 // the committed ones; nil on error
	err  error
}

// NewAllocator returns the local pool of instance (a name; a random
// suffix makes the owner unique to this process). Run must be running.
func NewAllocator(c *Central, instance string, opts ...AllocatorOption) *Allocator {
	o := allocOptions{low: 1000, chunk: 5000, ttl: 10 * time.Second, seed: rand.Uint64(), refillWait: 2 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	return &Allocator{c: c, owner: instance + "-" + strconv.FormatUint(rand.Uint64()>>16, 36), o: o,
		filled: make(chan struct{}), refill: make(chan struct{}, 1), commits: make(chan *commitReq, 1024), stopped: make(chan struct{})}
}

// ErrStopped answers an allocation after Run ended.
var ErrStopped = errors.New("pool: allocator stopped")

// ErrJournalDown answers an allocation while no lease can be journaled
// on uin.pool (Kafka unreachable): nothing is handed out that the pool's
// source of truth does not know.
var ErrJournalDown = errors.New("pool: uin.pool cannot be written; no uin is handed out until it can")

// errJournal is a refill whose lease could not be journaled (Kafka down):
// it is not fatal, the next refill tries again.
var errJournal = errors.New("pool: lease not journaled")

// Owner is the name the lease set is kept under.
func (a *Allocator) Owner() string { return a.owner }

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

// Run keeps the heartbeat, refills the local pool, commits allocations
// in groups, and sweeps lapsed leases until ctx ends; then it gives its
// own lease back (a graceful stop strands nothing either).
func (a *Allocator) Run(ctx context.Context) error {
	c := a.c
	if err := a.beat(ctx); err != nil {
		return err
	}
	done := make(chan struct{})
	defer func() {
		<-done
		// Bounded: a journal that cannot be written leaves the lease listed
		// as returning, and another instance's sweep finishes it.
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		a.mu.Lock()
		a.local = nil
		a.mu.Unlock()
		_ = c.rdb.Del(stop, c.aliveKey(a.owner)).Err()
		_, _ = c.ReturnLease(stop, a.owner, false)
	}()
	go func() { defer close(done); defer close(a.stopped); a.commitLoop(ctx) }()
	rng := rand.New(rand.NewPCG(a.o.seed, a.o.seed^0x9e37))
	beat := time.NewTicker(a.o.ttl / 3)
	defer beat.Stop()
	sweep := time.NewTicker(a.o.ttl)
	defer sweep.Stop()
	if n, err := c.SweepLapsed(ctx); err == nil {
		a.Returned.Add(int64(n))
	}
	for {
		if err := a.fill(ctx, rng); errors.Is(err, errJournal) {
			a.journalFailed.Store(true)
		} else if err != nil && !errors.Is(err, ErrExhausted) && !errors.Is(err, ErrRebuilding) && ctx.Err() == nil {
			return err
		} else {
			a.journalFailed.Store(false)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.refill:
		case <-beat.C:
			if err := a.beat(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		case <-sweep.C:
			if n, err := c.SweepLapsed(ctx); err == nil {
				a.Returned.Add(int64(n))
			}
		}
	}
}

// beat renews the heartbeat: the deadline it holds is what sweeps
// compare with their clock (a deadline, not a key TTL, so a sweep needs no
// trust in when Redis expires keys); the TTL only cleans up after it.
func (a *Allocator) beat(ctx context.Context) error {
	return a.c.rdb.Set(ctx, a.c.aliveKey(a.owner), time.Now().Add(a.o.ttl).UnixMilli(), 10*a.o.ttl).Err()
}

// fill leases until the local pool holds at least low uins (or the
// central pool is dry), waking Allocate calls waiting for uins.
func (a *Allocator) fill(ctx context.Context, rng *rand.Rand) error {
	defer a.wake()
	for {
		a.mu.Lock()
		held := len(a.local)
		a.mu.Unlock()
		wanted := int(a.wanted.Load())
		if held >= a.o.low && held >= wanted {
			return nil
		}
		uins, gen, err := a.c.lease(ctx, a.owner, max(a.o.chunk, wanted-held), rng)
		a.dry.Store(errors.Is(err, ErrExhausted))
		if errors.Is(err, ErrRebuilding) {
			a.dropLocal()
		}
		if err != nil {
			return err
		}
		// On the journal before any of them can be handed out: a leased
		// uin counts as allocated (a rebuild leaves it out of the pool)
		// until its lease is returned (GIVEN_BACK). One that cannot be
		// journaled stays in the lease, never handed out, and goes back
		// to its bucket when the lease is returned.
		// Bounded, so a broker that does not answer stalls neither the
		// heartbeat nor the sweeps of this loop.
		jctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = a.c.record(jctx, pb.PoolChange_ALLOCATE, "leased", uins)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: %w", errJournal, err)
		}
		a.mu.Lock()
		if old := a.gen.Load(); old != nil && *old != gen {
			a.local = a.local[:0] // leased in a pool that was rebuilt since
		}
		a.gen.Store(&gen)
		a.local = append(a.local, uins...)
		a.mu.Unlock()
		a.rebuilding.Store(false)
		a.wake()
	}
}

// dropLocal forgets the local pool: its lease is gone with the pool it
// was taken from (a commit of it would be refused anyway).
func (a *Allocator) dropLocal() {
	a.rebuilding.Store(true)
	a.mu.Lock()
	a.local = nil
	a.mu.Unlock()
}

func (a *Allocator) wake() {
	a.mu.Lock()
	close(a.filled)
	a.filled = make(chan struct{})
	a.mu.Unlock()
}

// commitLoop runs the commit script for every waiting allocation at
// once: callers arriving during one round trip share the next.
func (a *Allocator) commitLoop(ctx context.Context) {
	for {
		var batch []*commitReq
		select {
		case <-ctx.Done():
			return
		case r := <-a.commits:
			batch = append(batch, r)
		}
		n := len(batch[0].uins)
	more:
		for n < 10000 {
			select {
			case r := <-a.commits:
				batch = append(batch, r)
				n += len(r.uins)
			default:
				break more
			}
		}
		// A caller that left while waiting (a reset HTTP/2 stream, a
		// client timeout) gets nothing committed: its uins stay local.
		live := batch[:0]
		for _, r := range batch {
			if r.ctx.Err() != nil {
				a.putBack(r.uins)
				r.ok <- nil
				continue
			}
			live = append(live, r)
		}
		batch = live
		if len(batch) == 0 {
			continue
		}
		all := make([]uint32, 0, n)
		for _, r := range batch {
			all = append(all, r.uins...)
		}
		// The uins were journaled as allocated when they were leased.
		gen := ""
		if g := a.gen.Load(); g != nil {
			gen = *g
		}
		ok, err := a.c.commit(ctx, a.owner, gen, all)
		if errors.Is(err, ErrRebuilding) {
			a.dropLocal()
			a.kick()
		}
		committed := make(map[uint32]struct{}, len(ok))
		for _, u := range ok {
			committed[u] = struct{}{}
		}
		for _, r := range batch {
			if err != nil {
				r.err = err
				r.ok <- nil
				continue
			}
			mine := make([]uint32, 0, len(r.uins))
			for _, u := range r.uins {
				if _, in := committed[u]; in {
					mine = append(mine, u)
				}
			}
			r.ok <- mine
		}
	}
}

// RefillWait is how long Allocate waits for refills (the RefillWait option).
func (a *Allocator) RefillWait() time.Duration { return a.o.refillWait }

// Allocate hands out up to n uins (fewer only when the pool runs dry).
// It returns once they are marked used in Redis, so a uin the caller
// received survives any crash as allocated, and no other caller, here or
// at another allocator, can ever receive it.
func (a *Allocator) Allocate(ctx context.Context, n int) ([]uint32, error) {
	if a.rebuilding.Load() {
		a.kick() // a refill finds out whether the rebuild is over
		return nil, ErrRebuilding
	}
	var out []uint32
	waited := false
	deadline := time.Now().Add(a.o.refillWait)
	for len(out) < n {
		a.mu.Lock()
		k := min(n-len(out), len(a.local))
		take := append([]uint32(nil), a.local[len(a.local)-k:]...)
		a.local = a.local[:len(a.local)-k]
		low, filled := len(a.local) < a.o.low, a.filled
		a.mu.Unlock()
		if low {
			a.kick()
		}
		if k == 0 {
			// Wait for refills while the central pool has uins (a
			// refill that found it dry ends the wait), up to RefillWait.
			if len(out) > 0 || waited && a.dry.Load() || time.Now().After(deadline) {
				break
			}
			waited = true
			a.wanted.Add(int64(n - len(out)))
			a.kick()
			began := time.Now()
			select {
			case <-filled:
			case <-ctx.Done():
				a.wanted.Add(-int64(n - len(out)))
				return nil, ctx.Err()
			case <-time.After(time.Until(deadline)):
			}
			// Waiting for a refill is not the service's load: an HTTP
			// gate in front leaves it out of the latency it steers by.
			admission.Excuse(ctx, time.Since(began))
			a.wanted.Add(-int64(n - len(out)))
			continue
		}
		r := &commitReq{ctx: ctx, uins: take, ok: make(chan []uint32, 1)}
		select {
		case a.commits <- r:
		case <-ctx.Done():
			a.putBack(take)
			return out, ctx.Err()
		}
		var got []uint32
		select {
		case got = <-r.ok:
		case <-a.stopped:
			a.putBack(take) // never taken by the commit loop
			return out, ErrStopped
		}
		if got == nil && r.err == nil && ctx.Err() != nil { // dropped uncommitted: the caller is gone
			a.Allocated.Add(int64(len(out)))
			return out, ctx.Err()
		}
		if errors.Is(r.err, ErrRebuilding) {
			return nil, r.err // the local pool is gone with its generation
		}
		if r.err != nil {
			// Unknown whether the script ran: the uins go back; one that
			// did commit is no longer in the lease and can never be
			// committed again, so it is skipped, never handed out twice.
			a.putBack(take)
			if len(out) > 0 {
				break
			}
			return nil, r.err
		}
		out = append(out, got...)
	}
	a.Allocated.Add(int64(len(out)))
	if len(out) == 0 {
		if a.journalFailed.Load() {
			return nil, ErrJournalDown
		}
		return nil, ErrExhausted
	}
	return out, nil
}

// GiveBack returns uins this allocator handed out to a caller that never
// received them (its client was gone before the answer was written): they
// are unmarked and go back into the local pool, for the next caller. It
// answers how many went back.
func (a *Allocator) GiveBack(ctx context.Context, uins []uint32) (int, error) {
	if len(uins) == 0 {
		return 0, nil
	}
	// Back in the lease: still allocated as the journal sees it, until
	// the lease is returned.
	back, err := a.c.uncommit(ctx, a.owner, uins)
	if err != nil {
		return 0, err
	}
	a.putBack(back)
	a.Allocated.Add(-int64(len(back)))
	return len(back), nil
}

func (a *Allocator) putBack(uins []uint32) {
	a.mu.Lock()
	a.local = append(a.local, uins...)
	a.mu.Unlock()
}

// Kick asks for a refill now (the pool was rebuilt).
func (a *Allocator) Kick() { a.kick() }

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
