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
