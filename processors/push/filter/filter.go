// Package filter is the chain a send job's package passes before anything
// is sent: relation (still a follower), blacklist, targeting conditions, CRC
// (the same content never twice to one user) and the frequency quota. Each
// filter is one bit of a mask; the mask comes from the job or, when the job
// sets none, from its account. Every filter works on whole roaring bitmaps,
// so a 10-million-user package is a handful of set operations, not a loop.
package filter

import (
	"context"
	"fmt"
	"surge/schemas/uinset"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"

	"surge/processors/push/internal/quota"
	pb "surge/schemas/surgev1"
)

// Bit names one filter in a mask.
type Bit uint32

const (
	Relation Bit = 1 << iota
	Blacklist
	Targeting
	CRC
	Quota
	// All is every filter.
	All = Relation | Blacklist | Targeting | CRC | Quota
)

var bitNames = map[Bit]string{Relation: "relation", Blacklist: "blacklist", Targeting: "targeting", CRC: "crc", Quota: "quota"}

func (b Bit) String() string {
	if n, ok := bitNames[b]; ok {
		return n
	}
	return fmt.Sprintf("bit(%d)", uint32(b))
}

// Job is what a filter needs to know about the job being filtered.
type Job struct {
	*pb.SendJob
	Now time.Time
	// Followers returns the account's follower set (mirror or source).
	Followers func(ctx context.Context) (*roaring.Bitmap, error)
}

// Filter removes targets from the set in place.
type Filter interface {
	Bit() Bit
	Apply(ctx context.Context, j *Job, targets *roaring.Bitmap) error
}

// Committer is a filter with state to charge once the chain has decided:
// it sees only the users every filter kept.
type Committer interface {
	Commit(j *Job, kept *roaring.Bitmap)
}

// Result says what the chain kept and what each filter removed.
type Result struct {
	Kept    *roaring.Bitmap
	Removed map[Bit]*roaring.Bitmap
}

// Chain runs filters in order: the stateless ones first, the quota last,
// since taking quota charges it; the CRC filter charges in Commit, after
// the whole chain, so neither is charged for a user another filter removed.
type Chain struct{ filters []Filter }

// NewChain returns a chain running filters in the given order.
func NewChain(filters ...Filter) *Chain { return &Chain{filters: filters} }

// Mask is the set of filters on for a job: the job's own mask, else the
// account's; a real-time job (a system alert) is exempt from the quota.
func Mask(job *pb.SendJob, accountDefault Bit) Bit {
	m := Bit(job.FilterMask)
	if m == 0 {
		m = accountDefault
	}
	if job.Realtime {
		m &^= Quota
	}
	return m
}

// Run filters targets (which it consumes) with the filters in mask.
func (c *Chain) Run(ctx context.Context, j *Job, mask Bit, targets *roaring.Bitmap) (Result, error) {
	res := Result{Removed: map[Bit]*roaring.Bitmap{}}
	for _, f := range c.filters {
		if mask&f.Bit() == 0 {
			continue
		}
		before := targets.Clone()
		if err := f.Apply(ctx, j, targets); err != nil {
			return res, fmt.Errorf("filter %s: %w", f.Bit(), err)
		}
		before.AndNot(targets)
		res.Removed[f.Bit()] = before
	}
	res.Kept = targets
	for _, f := range c.filters {
		if c, ok := f.(Committer); ok && mask&f.Bit() != 0 {
			c.Commit(j, targets)
		}
	}
	return res, nil
}

// RelationFilter keeps followers of the job's account.
type RelationFilter struct{}

func (RelationFilter) Bit() Bit { return Relation }
func (RelationFilter) Apply(ctx context.Context, j *Job, t *roaring.Bitmap) error {
	if j.Source == pb.TargetSource_FOLLOWERS {
		return nil // the package is the follower list itself
	}
	f, err := j.Followers(ctx)
	if err != nil {
		return err
	}
	t.And(f)
	return nil
}

// Blacklists holds a global blacklist and one per account.
type Blacklists struct {
	mu        sync.RWMutex
	global    *roaring.Bitmap
	byAccount map[uint64]*roaring.Bitmap
}

// NewBlacklists returns empty blacklists.
func NewBlacklists() *Blacklists {
	return &Blacklists{global: roaring.New(), byAccount: map[uint64]*roaring.Bitmap{}}
}

// Add blacklists uins for account (0 = for every account).
func (b *Blacklists) Add(account uint64, uins ...uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if account == 0 {
		b.global.AddMany(uins)
		return
	}
	if b.byAccount[account] == nil {
		b.byAccount[account] = roaring.New()
	}
	b.byAccount[account].AddMany(uins)
}

// Remove takes uins off account's blacklist (0 = the global one).
func (b *Blacklists) Remove(account uint64, uins ...uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.global
	if account != 0 {
		set = b.byAccount[account]
	}
	if set != nil {
		for _, u := range uins {
			set.Remove(u)
		}
	}
}

func (b *Blacklists) Bit() Bit { return Blacklist }
func (b *Blacklists) Apply(_ context.Context, j *Job, t *roaring.Bitmap) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	t.AndNot(b.global)
	if a := b.byAccount[j.AccountId]; a != nil {
		t.AndNot(a)
	}
	return nil
}

// Tags is a tag index: tag -> users carrying it. It also converges a TAGS
// job into its package (every tag of the job must hold).
type Tags struct {
	mu   sync.RWMutex
	tags map[string]*roaring.Bitmap
}

// NewTags returns an empty index.
func NewTags() *Tags { return &Tags{tags: map[string]*roaring.Bitmap{}} }

// Tag gives uins the tag.
func (x *Tags) Tag(tag string, uins ...uint32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.tags[tag] == nil {
		x.tags[tag] = roaring.New()
	}
	x.tags[tag].AddMany(uins)
}

// Untag takes the tag from uins.
func (x *Tags) Untag(tag string, uins ...uint32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if set := x.tags[tag]; set != nil {
		for _, u := range uins {
			set.Remove(u)
		}
	}
}

// Match returns the users carrying every tag; an unknown tag matches nobody.
func (x *Tags) Match(tags []string) (*roaring.Bitmap, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if len(tags) == 0 {
		return nil, fmt.Errorf("no tags given")
	}
	var out *roaring.Bitmap
	for _, tag := range tags {
		set, ok := x.tags[tag]
		if !ok {
			return roaring.New(), nil
		}
		if out == nil {
			out = set.Clone()
		} else {
			out.And(set)
		}
	}
	return out, nil
}

func (x *Tags) Bit() Bit { return Targeting }
func (x *Tags) Apply(_ context.Context, j *Job, t *roaring.Bitmap) error {
	if len(j.Tags) == 0 || j.Source == pb.TargetSource_TAGS {
		return nil // no conditions, or the package already is the match
	}
	m, err := x.Match(j.Tags)
	if err != nil {
		return err
	}
	t.And(m)
	return nil
}

// Sent remembers, per content CRC, who received that content: the CRC
// filter. It is rebuilt on start from the filtered packages of past jobs.
type Sent struct {
	mu    sync.Mutex
	byCRC map[uint32]*roaring.Bitmap
}

// NewSent returns an empty CRC filter.
func NewSent() *Sent { return &Sent{byCRC: map[uint32]*roaring.Bitmap{}} }

// Record marks content crc as sent to uins. A content sent to nobody
// leaves no entry (a job that waited for quota filtered nobody in).
func (s *Sent) Record(crc uint32, uins *roaring.Bitmap) {
	if uins.IsEmpty() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byCRC[crc] == nil {
		s.byCRC[crc] = roaring.New()
	}
	s.byCRC[crc].Or(uins)
}

// Forget unmarks content crc for uins (a cancelled job's targets it never
// reached).
func (s *Sent) Forget(crc uint32, uins *roaring.Bitmap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.byCRC[crc]; b != nil {
		if b.AndNot(uins); b.IsEmpty() {
			delete(s.byCRC, crc)
		}
	}
}

// Export serializes who received each content (a checkpoint).
func (s *Sent) Export() (map[uint32][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint32][]byte, len(s.byCRC))
	for crc, b := range s.byCRC {
		buf, err := b.ToBytes()
		if err != nil {
			return nil, err
		}
		out[crc] = buf
	}
	return out, nil
}

// Import replaces the filter with what Export wrote.
func (s *Sent) Import(byCRC map[uint32][]byte) error {
	m := make(map[uint32]*roaring.Bitmap, len(byCRC))
	for crc, buf := range byCRC {
		b, err := uinset.Decode(buf)
		if err != nil {
			return fmt.Errorf("filter: content %d: %w", crc, err)
		}
		m[crc] = b
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byCRC = m
	return nil
}

func (s *Sent) Bit() Bit { return CRC }
func (s *Sent) Apply(_ context.Context, j *Job, t *roaring.Bitmap) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.byCRC[j.ContentCrc]; prev != nil {
		t.AndNot(prev)
	}
	return nil
}

// Commit charges the users the chain kept: they now have this content.
func (s *Sent) Commit(j *Job, kept *roaring.Bitmap) { s.Record(j.ContentCrc, kept) }

// QuotaFilter applies the daily frequency quota.
type QuotaFilter struct{ Ledger *quota.Ledger }

func (QuotaFilter) Bit() Bit { return Quota }
func (q QuotaFilter) Apply(_ context.Context, j *Job, t *roaring.Bitmap) error {
	granted, _ := q.Ledger.Take(j.Now, t)
	t.And(granted)
	return nil
}
