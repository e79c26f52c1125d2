package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
)

// HasGeneration reports whether the pool in Redis is there: its
// generation marker is set by the last Rebuild, and gone when Redis lost
// its data.
func (c *Central) HasGeneration(ctx context.Context) (bool, error) {
	n, err := c.rdb.Exists(ctx, c.gen()).Result()
	return n == 1, err
}

// RebuildOptions tune Rebuild.
type RebuildOptions struct {
	// Settle is how long a rebuild waits, once it holds the lock and the
	// topic has records, for changes made just before the loss to be on
	// the topic (a restore's claim, a recycle batch's records).
	Settle time.Duration
	// Force rebuilds a pool that is there (its generation is dropped
	// first, so every change waits for the rebuild).
	Force bool
	// Held, when set, answers which uins an account holds: a released
	// uin an account holds stays out of the pool, as the live release
	// refuses it.
	Held func(ctx context.Context, uins []uint32) ([]bool, error)
	// Progress hears of the records read, every 10,000.
	Progress func(records int)
	Log      *slog.Logger
}

// RebuildSummary is what a rebuild did.
type RebuildSummary struct {
	Records      int // uin.pool records read
	Skipped      int // records keyed by another bucket than their uins'
	Used, Pooled uint64
	KeptOut      int           // released uins an account holds
	Took         time.Duration // with the settle wait
	Waited       bool          // another instance rebuilt; this one waited for it
}

// Rebuild folds topic (uin.pool) back into the pool in Redis, unless the
// pool is there (Force aside). One instance rebuilds at a time, holding a
// lock in Redis; another waits for its generation marker.
func (c *Central) Rebuild(ctx context.Context, kc streams.Cluster, topic string, o RebuildOptions) (RebuildSummary, error) {
	if len(kc.Seeds) == 0 {
		return RebuildSummary{}, errors.New("pool: no Kafka cluster to rebuild the pool from")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	began := time.Now()
	lock, owner := c.prefix+"rebuild-lock", randomHex()
	for {
		if !o.Force {
			if ok, err := c.HasGeneration(ctx); err != nil || ok {
				return RebuildSummary{Waited: true, Took: time.Since(began)}, err
			}
		}
		ok, err := c.rdb.SetNX(ctx, lock, owner, 10*time.Minute).Result()
		if err != nil {
			return RebuildSummary{}, err
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return RebuildSummary{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer unlockScript.Run(context.WithoutCancel(ctx), c.rdb, []string{lock}, owner)
	if o.Force {
		if err := c.rdb.Del(ctx, c.gen()).Err(); err != nil {
			return RebuildSummary{}, err
		}
	} else if ok, err := c.HasGeneration(ctx); err != nil || ok {
		return RebuildSummary{Waited: true, Took: time.Since(began)}, err // rebuilt while we waited for the lock
	}

	records, err := streams.RecordsIn(ctx, kc, topic)
	if err != nil {
		return RebuildSummary{}, err
	}
	if records > 0 && o.Settle > 0 {
		o.Log.Warn("uin pool: missing from Redis; rebuilding it from the topic (allocations answer 503 meanwhile)", "topic", topic, "records", records, "settle", o.Settle)
		select {
		case <-ctx.Done():
			return RebuildSummary{}, ctx.Err()
		case <-time.After(o.Settle):
		}
	}
	f := NewFold(c.buckets)
	var sum RebuildSummary
	var next map[int32]int64
	if records > 0 { // else an empty pool (a new namespace, or a topic not made yet)
		next, err = streams.ReplayTo(ctx, kc, topic, streams.ReplayFrom{}, func(r *kgo.Record) error {
			var ch pb.PoolChange
			if err := streams.Decode(r, &ch); err == nil {
				f.Apply(r.Key, &ch)
			}
			if sum.Records++; o.Progress != nil && sum.Records%10_000 == 0 {
				o.Progress(sum.Records)
			}
			return nil
		})
	}
	if err != nil {
		return RebuildSummary{}, fmt.Errorf("pool: read %s: %w", topic, err)
	}
	if o.Held != nil && !f.Released.IsEmpty() {
		released := f.Released.ToArray()
		held, err := o.Held(ctx, released)
		if err != nil {
			return RebuildSummary{}, err
		}
		var out []uint32
		for i, h := range held {
			if h {
				out = append(out, released[i])
			}
		}
		f.KeepOut(out)
		sum.KeptOut = len(out)
	}
	if err := c.Restore(ctx, f, next); err != nil {
		return RebuildSummary{}, err
	}
	sum.Skipped, sum.Used, sum.Pooled = f.Skipped, f.Used.GetCardinality(), f.Pooled.GetCardinality()
	sum.Took = time.Since(began)
	o.Log.Info("uin pool: rebuilt from the topic", "topic", topic, "records", sum.Records, "used", sum.Used, "pooled", sum.Pooled,
		"kept_out", sum.KeptOut, "skipped", sum.Skipped, "took", sum.Took.Round(time.Millisecond))
	return sum, nil
}

var unlockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Restore writes a fold into Redis as the whole pool, replacing what is
// there (leases included: their owners' local pools are refused at their
// next commit), marks the releases up to applied (the next offset of each
// partition of uin.pool) as applied, and sets a new generation last, so
// no change is made on a pool half written.
func (c *Central) Restore(ctx context.Context, f *Fold, applied map[int32]int64) error {
	owners, err := c.rdb.SMembers(ctx, c.leasesKey()).Result()
	if err != nil {
		return err
	}
	returning, err := c.rdb.SMembers(ctx, c.returningKey()).Result()
	if err != nil {
		return err
	}
	pipe := c.rdb.Pipeline()
	pipe.Del(ctx, c.gen())
	for _, r := range returning {
		pipe.Del(ctx, r)
	}
	for b := range c.buckets {
		pipe.Del(ctx, c.bucketPrefix()+strconv.Itoa(b))
	}
	for _, o := range owners {
		pipe.Del(ctx, c.leaseKey(o), c.aliveKey(o))
	}
	pipe.Del(ctx, c.leasesKey(), c.returningKey(), c.used(), c.held(), c.releaseOffsets())
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if err := c.writeBitmap(ctx, c.used(), f.Used); err != nil {
		return err
	}
	if err := c.writeBitmap(ctx, c.held(), roaring.Or(f.Used, f.Pooled)); err != nil {
		return err
	}
	if err := c.fillBuckets(ctx, f.Pooled); err != nil {
		return err
	}
	if len(applied) > 0 {
		m := make(map[string]any, len(applied))
		for p, next := range applied {
			m[strconv.Itoa(int(p))] = next - 1
		}
		if err := c.rdb.HSet(ctx, c.releaseOffsets(), m).Err(); err != nil {
			return err
		}
	}
	return c.rdb.Set(ctx, c.gen(), randomHex(), 0).Err()
}

// window is the bitmap bytes one SETRANGE writes.
const window = 1 << 20

// writeBitmap writes bm as a Redis bitmap at key (bit n is byte n/8, most
// significant bit first), a window of 1 MiB at a time, skipping windows
// with no bit set.
func (c *Central) writeBitmap(ctx context.Context, key string, bm *roaring.Bitmap) error {
	buf := make([]byte, window)
	cur := int64(-1)
	pipe := c.rdb.Pipeline()
	flush := func() {
		if cur >= 0 {
			pipe.SetRange(ctx, key, cur*window, string(buf))
			clear(buf)
		}
	}
	it := bm.Iterator()
	for it.HasNext() {
		u := int64(it.Next())
		if w := u / 8 / window; w != cur {
			flush()
			cur = w
		}
		i := u/8 - cur*window
		buf[i] |= 0x80 >> (u & 7)
	}
	flush()
	if cur < 0 {
		return nil
	}
	_, err := pipe.Exec(ctx)
	return err
}

// fillBuckets puts every uin of pooled into its bucket, in pipelines of
// about 100,000 uins.
func (c *Central) fillBuckets(ctx context.Context, pooled *roaring.Bitmap) error {
	by := make(map[uint32][]any)
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		pipe := c.rdb.Pipeline()
		for b, us := range by {
			for lo := 0; lo < len(us); lo += 1000 {
				pipe.SAdd(ctx, c.bucketPrefix()+strconv.Itoa(int(b)), us[lo:min(lo+1000, len(us))]...)
			}
		}
		clear(by)
		n = 0
		_, err := pipe.Exec(ctx)
		return err
	}
	it := pooled.Iterator()
	for it.HasNext() {
		u := it.Next()
		b := u % uint32(c.buckets)
		by[b] = append(by[b], u)
		if n++; n >= 100_000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// Keeper keeps the pool in Redis for a process that changes it: it checks
// the generation marker at start, every interval and when told the pool
// was found lost (Lost), and rebuilds the pool from uin.pool when it is
// missing. Every such process runs one, so a pool lost while only the
// recycle controllers run is rebuilt too; Rebuild's lock lets one rebuild
// and the others wait.
type Keeper struct {
	c        *Central
	kc       streams.Cluster
	topic    string
	o        RebuildOptions
	interval time.Duration
	lost     chan struct{}
	ready    atomic.Bool
	// OnReady, when set, hears that the pool is there again.
	OnReady func()
	// OnRebuild, when set, hears each rebuild's outcome.
	OnRebuild func(RebuildSummary, error)
}

// NewKeeper keeps c's pool, rebuilt from topic on kc.
func (c *Central) NewKeeper(kc streams.Cluster, topic string, o RebuildOptions) *Keeper {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Keeper{c: c, kc: kc, topic: topic, o: o, interval: 2 * time.Second, lost: make(chan struct{}, 1)}
}

// Lost tells the keeper a change found the pool missing (ErrRebuilding).
func (k *Keeper) Lost() {
	k.ready.Store(false)
	select {
	case k.lost <- struct{}{}:
	default:
	}
}

// Peek looks at the generation marker only (no rebuild): a caller that
// found the keeper not ready learns at once that the pool is back.
func (k *Keeper) Peek(ctx context.Context) bool {
	if k.ready.Load() {
		return true
	}
	ok, err := k.c.HasGeneration(ctx)
	if err != nil || !ok {
		return false
	}
	k.markReady()
	return true
}

// markReady records that the pool is there, telling OnReady if it was not.
func (k *Keeper) markReady() {
	if !k.ready.Swap(true) && k.OnReady != nil {
		k.OnReady()
	}
}

// Check looks once, rebuilding a missing pool; it answers whether the
// pool is there.
func (k *Keeper) Check(ctx context.Context) bool {
	ok, err := k.c.HasGeneration(ctx)
	if err != nil {
		return false // Redis unreachable: the next check tries again
	}
	if !ok {
		k.ready.Store(false)
		sum, err := k.c.Rebuild(ctx, k.kc, k.topic, k.o)
		if k.OnRebuild != nil {
			k.OnRebuild(sum, err)
		}
		if err != nil {
			if ctx.Err() == nil {
				k.o.Log.Error("uin pool: not rebuilt; trying again", "topic", k.topic, "err", err)
			}
			return false
		}
	}
	k.markReady()
	return true
}

// Run checks until ctx ends.
func (k *Keeper) Run(ctx context.Context) error {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		k.Check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-k.lost:
		}
	}
}
