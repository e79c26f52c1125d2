package pool

import (
	"bytes"

	"github.com/RoaringBitmap/roaring/v2"

	pb "surge/schemas/surgev1"
)

// Fold is the pool as uin.pool says it is: the uins handed out (used) and
// the uins available (pooled). Every change of a uin is keyed by its bucket,
// so a uin's changes are read in the order they were made, and each op
// counts as its effect in Redis does:
//
//	INSERT      pooled, unless used (the live insertion refuses a used uin;
//	            a recycle release's record may follow an allocation of the
//	            uin it pooled, since the controller's records commit with
//	            its batch, after the effect)
//	ALLOCATE    used: leased to an allocator (journaled before any of
//	            them can be handed out) or claimed by a restore
//	RELEASE     pooled, if used (a registration gave it up); Rebuild keeps
//	            out one an account holds, as the live release does
//	GIVEN_BACK  pooled, if used (a lease returned: an allocator stopped,
//	            or its heartbeat lapsed; journaled after the lease was
//	            taken from it, before its uins are back in their buckets)
//	FREE        no longer used (the account was deleted): neither, until
//	            its INSERT
//	REFUSED     nothing
//
// A record whose key is not the bucket of its uins is skipped: ordering
// holds only within the bucket's partition, and the pool service
// dead-letters such a release too.
type Fold struct {
	Used, Pooled *roaring.Bitmap
	// Released are the pooled uins whose last change was a RELEASE.
	Released *roaring.Bitmap
	Changes  int // records applied
	Skipped  int // records whose key was not their bucket's
	buckets  uint32
}

// NewFold returns an empty fold for a pool of buckets buckets.
func NewFold(buckets int) *Fold {
	return &Fold{Used: roaring.New(), Pooled: roaring.New(), Released: roaring.New(), buckets: uint32(max(buckets, 1))}
}

// UinsOf are the uins a change names.
func UinsOf(c *pb.PoolChange) []uint32 {
	out := c.Uins
	if c.Uin != 0 && c.Uin <= 1<<32-1 {
		out = append([]uint32{uint32(c.Uin)}, out...)
	}
	return out
}

// KeyFits reports whether key is the bucket key of every uin of c.
func KeyFits(key []byte, c *pb.PoolChange, buckets int) bool {
	for _, u := range UinsOf(c) {
		if !bytes.Equal(key, BucketKey(u%uint32(max(buckets, 1)))) {
			return false
		}
	}
	return true
}

// Apply folds one change in, read from a record keyed key.
func (f *Fold) Apply(key []byte, c *pb.PoolChange) {
	if !KeyFits(key, c, int(f.buckets)) {
		f.Skipped++
		return
	}
	f.Changes++
	for _, u := range UinsOf(c) {
		switch c.Op {
		case pb.PoolChange_INSERT:
			if !f.Used.Contains(u) {
				f.Pooled.Add(u)
				f.Released.Remove(u)
			}
		case pb.PoolChange_ALLOCATE:
			f.Used.Add(u)
			f.Pooled.Remove(u)
			f.Released.Remove(u)
		case pb.PoolChange_RELEASE, pb.PoolChange_GIVEN_BACK:
			if f.Used.Contains(u) {
				f.Used.Remove(u)
				f.Pooled.Add(u)
				if c.Op == pb.PoolChange_RELEASE {
					f.Released.Add(u)
				}
			}
		case pb.PoolChange_FREE:
			f.Used.Remove(u)
		}
	}
}

// KeepOut takes uins out of the pooled set (a released uin an account
// holds).
func (f *Fold) KeepOut(uins []uint32) {
	for _, u := range uins {
		f.Pooled.Remove(u)
		f.Released.Remove(u)
		f.Used.Add(u)
	}
}
