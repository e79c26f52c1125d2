// Package quota is per-user frequency control: a user receives at most 6
// account messages a day, and the 6 are not first come, first served (seed
// 000: an operator creating at 23:45 a job for 00:00 would otherwise take
// the next day's quota without competition). The day has 6 competition
// windows, 2 in 00:00-12:00 and 4 in 12:00-24:00; each window releases one
// unit at a random moment inside it; a unit not used carries over to the
// next window; jobs compete only with jobs of the current window.
//
// Counts are kept as bitmaps by level: level[k] holds the users who have
// received at least k messages today. A batch of targets is checked and
// charged with a handful of bitmap operations, not a lookup per user.
package quota

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"surge/schemas/uinset"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
)

// PerDay is the most messages a user receives in a day.
const PerDay = 6

// Window is one competition window and the moment it releases its unit.
type Window struct {
	Start, End, Release time.Time
}

// Plan lays out the windows of the day containing t (in t's location); the
// release moments are random, but the same for every instance that uses
// the same seed, so all executors agree without talking.
func Plan(t time.Time, seed uint64) [PerDay]Window {
	y, m, d := t.Date()
	day := time.Date(y, m, d, 0, 0, 0, 0, t.Location())
	h := fnv.New64a()
	_, _ = h.Write([]byte(day.Format("2006-01-02")))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	bounds := []time.Duration{0, 6 * time.Hour, 12 * time.Hour, 15 * time.Hour, 18 * time.Hour, 21 * time.Hour, 24 * time.Hour}
	var w [PerDay]Window
	for i := range w {
		start, end := day.Add(bounds[i]), day.Add(bounds[i+1])
		w[i] = Window{Start: start, End: end, Release: start.Add(time.Duration(rng.Int64N(int64(end.Sub(start)))))}
	}
	return w
}

// Released is how many units are released by t: the carry-over is implicit,
// since a user may use every released unit not yet used.
func Released(t time.Time, seed uint64) int {
	n := 0
	for _, w := range Plan(t, seed) {
		if !t.Before(w.Release) {
			n++
		}
	}
	return n
}

// NextRelease is the first release moment after t on t's day; false when
// every window of the day has released its unit.
func NextRelease(t time.Time, seed uint64) (time.Time, bool) {
	for _, w := range Plan(t, seed) {
		if w.Release.After(t) {
			return w.Release, true
		}
	}
	return time.Time{}, false
}

// CurrentWindow is the index of the window containing t.
func CurrentWindow(t time.Time, seed uint64) int {
	for i, w := range Plan(t, seed) {
		if t.Before(w.End) {
			return i
		}
	}
	return PerDay - 1
}

// Ledger holds today's per-user counts as level bitmaps. It is a cache:
// the planner rebuilds it on start from the filtered packages of the jobs
// it filtered today (Charge), and it resets when the day changes.
type Ledger struct {
	mu     sync.Mutex
	day    string
	levels [PerDay + 1]*roaring.Bitmap // levels[0] unused: everyone has at least 0
	seed   uint64
}

// NewLedger returns an empty ledger using seed for window planning.
func NewLedger(seed uint64) *Ledger {
	l := &Ledger{seed: seed}
	l.reset("")
	return l
}

func (l *Ledger) reset(day string) {
	l.day = day
	for i := range l.levels {
		l.levels[i] = roaring.New()
	}
}

func (l *Ledger) roll(now time.Time) {
	if d := now.Format("2006-01-02"); d != l.day {
		l.reset(d)
	}
}

// Take returns the targets that still have a released unit at now and
// charges each of them one unit, atomically: concurrent jobs never push a
// user past the released count. The others are returned as refused.
func (l *Ledger) Take(now time.Time, targets *roaring.Bitmap) (granted, refused *roaring.Bitmap) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	released := Released(now, l.seed)
	if released == 0 {
		return roaring.New(), targets.Clone()
	}
	refused = roaring.And(targets, l.levels[released])
	granted = roaring.AndNot(targets, l.levels[released])
	l.charge(granted)
	return granted, refused
}

// charge adds one to the count of every user in s (all below the top level).
func (l *Ledger) charge(s *roaring.Bitmap) {
	for k := PerDay; k >= 2; k-- {
		l.levels[k].Or(roaring.And(l.levels[k-1], s))
	}
	l.levels[1].Or(s)
}

// Charge adds one unit to every user in s without checking releases: the
// restore of units taken before a restart.
func (l *Ledger) Charge(now time.Time, s *roaring.Bitmap) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	l.charge(s)
}

// Refund gives back a unit to users who were charged but not sent to
// (a job cancelled before it reached them).
func (l *Ledger) Refund(s *roaring.Bitmap) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := 1; k <= PerDay; k++ {
		next := roaring.New()
		if k < PerDay {
			next = roaring.And(l.levels[k+1], s)
		}
		// users at exactly level k lose level k
		exact := roaring.AndNot(roaring.And(l.levels[k], s), next)
		l.levels[k].AndNot(exact)
	}
}

// Export serializes the day's counts (a checkpoint): the day and, for
// each level k from 1, the users with at least k messages.
func (l *Ledger) Export() (string, [][]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([][]byte, 0, PerDay)
	for k := 1; k <= PerDay; k++ {
		buf, err := l.levels[k].ToBytes()
		if err != nil {
			return "", nil, err
		}
		out = append(out, buf)
	}
	return l.day, out, nil
}

// Import replaces the counts with what Export wrote; a day that is not
// today is dropped at the first use, as the ledger's own would be.
func (l *Ledger) Import(day string, levels [][]byte) error {
	if len(levels) != PerDay {
		return fmt.Errorf("quota: %d levels, want %d", len(levels), PerDay)
	}
	var bms [PerDay + 1]*roaring.Bitmap
	bms[0] = roaring.New()
	for k, buf := range levels {
		b, err := uinset.Decode(buf)
		if err != nil {
			return fmt.Errorf("quota: level %d: %w", k+1, err)
		}
		bms[k+1] = b
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.day, l.levels = day, bms
	return nil
}

// Count is how many messages uin received today.
func (l *Ledger) Count(now time.Time, uin uint32) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.roll(now)
	n := 0
	for k := 1; k <= PerDay && l.levels[k].Contains(uin); k++ {
		n = k
	}
	return n
}
