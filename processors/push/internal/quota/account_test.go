package quota

import "testing"

func TestAccountDailyJobsFollowsClickThrough(t *testing.T) {
	for _, c := range []struct {
		base                       uint32
		clicks, targets, minTarget uint64
		want                       uint32
	}{
		{10, 500, 10_000, 100, 10},    // 5%: on target
		{10, 1000, 10_000, 100, 20},   // 10%: twice, the cap
		{10, 9000, 10_000, 100, 20},   // capped at twice
		{10, 250, 10_000, 100, 5},     // 2.5%: half
		{10, 0, 10_000, 100, 3},       // no clicks: a quarter (2.5 rounds to 3)
		{2, 0, 10_000, 100, 1},        // never under one job
		{0, 9000, 10_000, 100, 0},     // no limit stays no limit
		{10, 0, 50, 100, 10},          // too few targets to judge: the base
		{10, 0, 0, 100, 10},           // no delivery yet
		{10, 20_000, 10_000, 100, 20}, // more clicks than targets: capped
	} {
		if got := AccountDailyJobs(c.base, c.clicks, c.targets, c.minTarget, 0.05); got != c.want {
			t.Errorf("AccountDailyJobs(%d, %d/%d) = %d, want %d", c.base, c.clicks, c.targets, got, c.want)
		}
	}
}
