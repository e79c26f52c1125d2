package order

import (
	"testing"

	pb "surge/schemas/surgev1"
)

// FuzzParse: an order number is the grant's idempotency key, so the text
// must name one grant only: whatever Parse accepts formats back to the
// very same text. Two spellings of one number ("01" and "1") would be two
// claims, and the same reward paid twice.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"u1_rain_r9_1_1", "a-b_c_d_2_4294967295", "u_s_r_01_1", "u_s_r_1_+1", "u_s_r_4294967297_1", "", "____", "u_s_r_1_1_1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if n.String() != s {
			t.Fatalf("%q parses to %+v, which formats as %q: two texts for one order", s, n, n.String())
		}
		g := &pb.RewardGrant{OrderNo: s, ActId: n.ActID, SceneId: n.SceneID, RainId: n.RainID, AwardType: n.AwardType, Stage: n.Stage}
		if err := Check(g); err != nil {
			t.Fatalf("%q parses but its own grant fails Check: %v", s, err)
		}
	})
}
