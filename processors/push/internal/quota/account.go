package quota

import "math"

// AccountDailyJobs is an account's daily job quota given its base quota
// (push.accounts daily_jobs) and its last delivery's click-through
// (clicks of targets; seed: quota follows the last delivery's effect):
// the base scaled by the rate over the target rate, between a quarter and
// twice the base, never under one job. A base of 0 (no limit) stays 0;
// without a measured delivery (fewer than minTargets targets) the base
// holds.
func AccountDailyJobs(base uint32, clicks, targets, minTargets uint64, target float64) uint32 {
	if base == 0 || targets == 0 || targets < minTargets || target <= 0 {
		return base
	}
	rate := float64(min(clicks, targets)) / float64(targets)
	f := min(max(rate/target, 0.25), 2)
	return max(1, uint32(math.Round(float64(base)*f)))
}
