// Package fanlist is the follower lists: the source store (the relation
// chain, a service of its own in production) and, for big accounts, a local
// roaring mirror kept current from push.fan-delta. The seed mirrors followers
// of accounts above 10 million as a file of 8-byte uins (100M x 8 B = 760 MB);
// a roaring bitmap of the same set is a small fraction of that.
//
// A mirror is trusted only after it passes the sampling rule: 10 samples,
// each of fans/10000 uins clamped to [100, 10000]; the mean error rate must
// be under 2% and no sample over 10%. Otherwise the job reads the source.
package fanlist

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"

	pb "surge/schemas/surgev1"
)

// ErrUnknownAccount is returned for an account the source does not know.
var ErrUnknownAccount = errors.New("unknown account")

// Source is the authoritative follower store.
type Source interface {
	// Followers returns the account's whole follower set (expensive).
	Followers(ctx context.Context, account uint64) (*roaring.Bitmap, error)
	// Follows reports, for each uin, whether it follows the account (cheap
	// point reads; what sampling uses).
	Follows(ctx context.Context, account uint64, uins []uint32) ([]bool, error)
	// Count returns the follower count.
	Count(ctx context.Context, account uint64) (uint64, error)
}

// Lists are the follower lists materialised from push.fan-delta (the
// relation chain's changelog, compacted by account and uin): the source
// store as the push services see it. They are rebuilt by replaying the
// topic; processors/push/directory feeds them.
type Lists struct {
	mu   sync.RWMutex
	sets map[uint64]*roaring.Bitmap
	// Reads counts Followers calls: how often the expensive path ran.
	Reads int
}

// NewLists returns empty lists.
func NewLists() *Lists { return &Lists{sets: map[uint64]*roaring.Bitmap{}} }

// AddAccount registers an account (with no followers yet).
func (s *Lists) AddAccount(account uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sets[account] == nil {
		s.sets[account] = roaring.New()
	}
}

// Apply applies one follow or unfollow read from push.fan-delta.
func (s *Lists) Apply(d *pb.FanDelta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.sets[d.AccountId]
	if set == nil {
		set = roaring.New()
		s.sets[d.AccountId] = set
	}
	if d.Op == pb.FanDelta_FOLLOW {
		set.Add(uint32(d.Uin))
	} else {
		set.Remove(uint32(d.Uin))
	}
}

func (s *Lists) Followers(_ context.Context, account uint64) (*roaring.Bitmap, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.sets[account]
	if !ok {
		return nil, fmt.Errorf("%w %d", ErrUnknownAccount, account)
	}
	s.Reads++
	return set.Clone(), nil
}

func (s *Lists) Follows(_ context.Context, account uint64, uins []uint32) ([]bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	set, ok := s.sets[account]
	if !ok {
		return nil, fmt.Errorf("%w %d", ErrUnknownAccount, account)
	}
	out := make([]bool, len(uins))
	for i, u := range uins {
		out[i] = set.Contains(u)
	}
	return out, nil
}

func (s *Lists) Count(_ context.Context, account uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	set, ok := s.sets[account]
	if !ok {
		return 0, fmt.Errorf("%w %d", ErrUnknownAccount, account)
	}
	return set.GetCardinality(), nil
}

// Mirror holds local follower bitmaps of the accounts it mirrors.
type Mirror struct {
	mu   sync.RWMutex
	sets map[uint64]*roaring.Bitmap
	only func(account uint64) bool
}

// NewMirror mirrors the accounts for which mirrored returns true (nil: all).
func NewMirror(mirrored func(account uint64) bool) *Mirror {
	return &Mirror{sets: map[uint64]*roaring.Bitmap{}, only: mirrored}
}

// Apply applies one delta from push.fan-delta. Deltas of one follower of
// one account are ordered (the topic is keyed by account and uin), so
// applying them in order is the whole consistency story.
func (m *Mirror) Apply(d *pb.FanDelta) {
	if m.only != nil && !m.only(d.AccountId) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	set := m.sets[d.AccountId]
	if set == nil {
		set = roaring.New()
		m.sets[d.AccountId] = set
	}
	switch d.Op {
	case pb.FanDelta_FOLLOW:
		set.Add(uint32(d.Uin))
	case pb.FanDelta_UNFOLLOW:
		set.Remove(uint32(d.Uin))
	}
}

// Get returns a copy of the mirrored set, if the account is mirrored.
func (m *Mirror) Get(account uint64) (*roaring.Bitmap, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	set, ok := m.sets[account]
	if !ok {
		return nil, false
	}
	return set.Clone(), true
}

// SizeInBytes is the mirror's serialized size over all accounts.
func (m *Mirror) SizeInBytes() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var n uint64
	for _, s := range m.sets {
		n += s.GetSerializedSizeInBytes()
	}
	return n
}

// Sampling rule constants (seed 000).
const (
	Samples      = 10
	MinSample    = 100
	MaxSample    = 10000
	MaxMeanError = 0.02
	MaxOneError  = 0.10
)

// SampleSize is fans/10000 clamped to [100, 10000].
func SampleSize(fans uint64) int {
	return int(min(max(fans/10000, MinSample), MaxSample))
}

// Validation is the outcome of sampling one mirror against the source.
type Validation struct {
	Account   uint64
	Errors    [Samples]float64 // error rate of each sample
	Mean      float64
	OK        bool
	SampleLen int
}

func (v Validation) String() string {
	return fmt.Sprintf("account %d: mean error %.2f%%, worst %.2f%%, %d x %d samples, ok=%v",
		v.Account, 100*v.Mean, 100*maxOf(v.Errors[:]), Samples, v.SampleLen, v.OK)
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// Validate samples the mirror against the source. Each sample draws uins
// at random from the union of what either side could hold: members of the
// mirror (catches uins that unfollowed but linger) and random uins in the
// mirror's range (catches followers the mirror missed); an error is a uin
// on which the two disagree. The rng makes tests reproducible.
func Validate(ctx context.Context, src Source, mirror *roaring.Bitmap, account uint64, rng *rand.Rand) (Validation, error) {
	v := Validation{Account: account}
	fans, err := src.Count(ctx, account)
	if err != nil {
		return v, err
	}
	v.SampleLen = SampleSize(fans)
	card := mirror.GetCardinality()
	lo, hi := uint32(0), uint32(0)
	if card > 0 {
		lo, hi = mirror.Minimum(), mirror.Maximum()
	}
	for i := range Samples {
		uins := make([]uint32, v.SampleLen)
		for j := range uins {
			if card > 0 && j%2 == 0 {
				uins[j], _ = mirror.Select(uint32(rng.Uint64N(card))) // member of the mirror
			} else if hi > lo {
				uins[j] = lo + uint32(rng.Uint64N(uint64(hi-lo)+1))
			} else {
				uins[j] = rng.Uint32()
			}
		}
		follows, err := src.Follows(ctx, account, uins)
		if err != nil {
			return v, err
		}
		wrong := 0
		for j, u := range uins {
			if mirror.Contains(u) != follows[j] {
				wrong++
			}
		}
		v.Errors[i] = float64(wrong) / float64(len(uins))
		v.Mean += v.Errors[i] / Samples
	}
	v.OK = v.Mean < MaxMeanError && maxOf(v.Errors[:]) <= MaxOneError
	if card == 0 && fans > 0 {
		v.OK = false // an empty mirror of a non-empty list is never right
	}
	return v, nil
}

// Resolver answers "who follows this account" the fast way when it can.
type Resolver struct {
	Source    Source
	Mirror    *Mirror
	Threshold uint64 // accounts with at least this many fans use the mirror
	Rand      *rand.Rand

	mu          sync.Mutex
	Validations []Validation // the latest outcomes, newest last (bounded)
}

// Followers returns the follower set and where it came from ("mirror" or
// "source"): the mirror when the account is big and its mirror validates.
func (r *Resolver) Followers(ctx context.Context, account uint64) (*roaring.Bitmap, string, error) {
	fans, err := r.Source.Count(ctx, account)
	if err != nil {
		return nil, "", err
	}
	if r.Mirror != nil && fans >= r.Threshold {
		if set, ok := r.Mirror.Get(account); ok {
			r.mu.Lock()
			rng := r.Rand
			if rng == nil {
				rng = rand.New(rand.NewPCG(account, fans))
			}
			v, err := Validate(ctx, r.Source, set, account, rng)
			if err == nil {
				r.Validations = append(r.Validations, v)
				if len(r.Validations) > 100 {
					r.Validations = r.Validations[1:]
				}
			}
			r.mu.Unlock()
			if err == nil && v.OK {
				return set, "mirror", nil
			}
		}
	}
	set, err := r.Source.Followers(ctx, account)
	return set, "source", err
}
