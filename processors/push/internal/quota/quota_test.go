package quota

import (
	"sync"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
)

func TestPlanHasTwoMorningAndFourAfternoonWindows(t *testing.T) {
	day := time.Date(2026, 2, 16, 0, 0, 0, 0, time.UTC)
	w := Plan(day.Add(5*time.Hour), 42)
	morning := 0
	for i, x := range w {
		if x.Release.Before(x.Start) || !x.Release.Before(x.End) {
			t.Errorf("window %d releases outside itself", i)
		}
		if x.End.Sub(day) <= 12*time.Hour {
			morning++
		}
	}
	if morning != 2 {
		t.Fatalf("%d morning windows, want 2", morning)
	}
	if w != Plan(day.Add(23*time.Hour), 42) {
		t.Fatal("instances with one seed disagree on the plan")
	}
	if Released(day, 42) != 0 || Released(day.Add(24*time.Hour-time.Nanosecond), 42) != PerDay {
		t.Fatal("released count at day ends")
	}
}

// Many jobs take quota for the same users at once, all day long: nobody
// gets more than the units released so far, nor more than 6 in the day.
func TestConcurrentJobsNeverExceedTheReleasedQuota(t *testing.T) {
	day := time.Date(2026, 2, 16, 0, 0, 0, 0, time.UTC)
	l := NewLedger(7)
	users := roaring.New()
	users.AddRange(0, 10000)
	for minute := 0; minute < 24*60; minute += 30 {
		now := day.Add(time.Duration(minute) * time.Minute)
		var wg sync.WaitGroup
		for job := 0; job < 8; job++ {
			wg.Add(1)
			go func() { defer wg.Done(); l.Take(now, users) }()
		}
		wg.Wait()
		rel := Released(now, 7)
		for _, u := range []uint32{0, 5000, 9999} {
			if c := l.Count(now, u); c != rel {
				t.Fatalf("%v: user %d has %d, released %d", now, u, c, rel)
			}
		}
	}
	end := day.Add(24*time.Hour - time.Minute)
	if c := l.Count(end, 1); c != PerDay {
		t.Fatalf("a user saturated all day received %d, want %d", c, PerDay)
	}
	g, r := l.Take(end, users)
	if !g.IsEmpty() || r.GetCardinality() != 10000 {
		t.Fatal("a seventh message was granted")
	}
	l.Refund(roaring.BitmapOf(1))
	if l.Count(end, 1) != PerDay-1 {
		t.Fatal("refund did not give a unit back")
	}
	if l.Count(end.Add(time.Hour), 1) != 0 {
		t.Fatal("counts did not reset on the next day")
	}
}

// NextRelease walks the day's release moments in order and ends after the
// sixth: each answer is the first moment after t, where Released goes up.
func TestNextReleaseIsWhereReleasedGoesUp(t *testing.T) {
	day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	plan := Plan(day, 42)
	at := day
	for i := range PerDay {
		next, ok := NextRelease(at, 42)
		if !ok || !next.Equal(plan[i].Release) {
			t.Fatalf("release %d: got %v %v, want %v", i, next, ok, plan[i].Release)
		}
		if Released(next.Add(-time.Millisecond), 42) != i || Released(next, 42) != i+1 {
			t.Fatalf("release %d at %v does not raise Released from %d", i, next, i)
		}
		at = next
	}
	if next, ok := NextRelease(at, 42); ok {
		t.Fatalf("a seventh release at %v", next)
	}
}
