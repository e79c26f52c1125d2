package tracker_test

import (
	"testing"
	"time"

	"surge/processors/uin/tracker"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
)

// TestJudge covers each rule at the checkpoints where it applies.
func TestJudge(t *testing.T) {
	tr := tracker.New(tracker.Config{}) // default checkpoints (4) and rules (3 reports, 50 messages)
	day := (24 * time.Hour).Milliseconds()
	reg := int64(1_000_000)
	live := func() *pb.Tracking {
		return &pb.Tracking{Uin: 1, RegisteredAtMs: reg, Completed: true, Logins: 4, Messages: 10, LastUsageMs: reg + 5*day, LastLoginMs: reg + 5*day}
	}
	cases := []struct {
		name string
		edit func(*pb.Tracking)
		at   int
		want string
	}{
		{"live at the first checkpoint", func(*pb.Tracking) {}, 0, ""},
		{"live at the last checkpoint", func(*pb.Tracking) {}, 3, ""},
		{"never completed", func(s *pb.Tracking) { s.Completed = false }, 0, recycling.Abandoned},
		{"spam reports", func(s *pb.Tracking) { s.SpamReports = 3 }, 0, recycling.Spam},
		{"two spam reports are not enough", func(s *pb.Tracking) { s.SpamReports = 2 }, 1, ""},
		{"burst sender from the second checkpoint", func(s *pb.Tracking) { s.Messages, s.Logins = 80, 1 }, 1, recycling.Spam},
		{"burst sender not judged at the first", func(s *pb.Tracking) { s.Messages, s.Logins = 80, 1 }, 0, ""},
		{"many messages with logins are a user", func(s *pb.Tracking) { s.Messages, s.Logins = 80, 5 }, 2, ""},
		{"quiet after the first day, at the last checkpoint", func(s *pb.Tracking) { s.LastUsageMs = reg + day/2 }, 3, recycling.Spam},
		{"quiet after the first day, not yet judged", func(s *pb.Tracking) { s.LastUsageMs = reg + day/2 }, 2, ""},
	}
	for _, c := range cases {
		s := live()
		c.edit(s)
		if got, why := tr.Judge(s, c.at); got != c.want {
			t.Errorf("%s: judged %q (%s), want %q", c.name, got, why, c.want)
		}
	}
}
