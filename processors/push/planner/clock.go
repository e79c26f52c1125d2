package planner

import (
	"time"

	"surge/processors/push/internal/quota"
)

// ReleasedDayClock is a clock for demos and load runs: the wall clock
// moved to 23:00 of the latest day by whose 23:00 every quota window (of
// seed) had released its unit, running at the wall clock's pace, so no
// job waits for a release still to come, whatever the hour of the run.
func ReleasedDayClock(seed uint64) func() time.Time {
	now := time.Now()
	late := time.Date(now.Year(), now.Month(), now.Day(), 23, 0, 0, 0, now.Location())
	for quota.Released(late, seed) < quota.PerDay {
		late = late.AddDate(0, 0, -1)
	}
	offset := late.Sub(now)
	return func() time.Time { return time.Now().Add(offset) }
}
