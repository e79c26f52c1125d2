package order

import (
	"strings"
	"testing"

	pb "surge/schemas/surgev1"
)

func TestParseAndCheck(t *testing.T) {
	n := Number{ActID: "a1", SceneID: "s1", RainID: "r9", AwardType: pb.AwardType_CASH, Stage: 2}
	got, err := Parse(n.String())
	if err != nil || got != n {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for _, good := range []string{"a-1_s-2_R9_1_1", strings.Repeat("z", 64) + "_s_r_1_0"} {
		if _, err := Parse(good); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	for _, bad := range []string{"", "a_b_c_1", "a_b_c_1_2_3", "a_b_c_9_1", "a_b_c_0_1", "a_b_c_x_1", "a_b_c_1_-1", "a b_s_r_1_1", "a__r_1_1", "é_s_r_1_1", "a_s!_r_1_1", strings.Repeat("a", 65) + "_s_r_1_1",
		// One order, one spelling: each of these is a_b_c_1_1 written
		// otherwise (found by FuzzParse; each would be a second claim).
		"a_b_c_01_1", "a_b_c_1_01", "a_b_c_+1_1", "a_b_c_1_+1", "a_b_c_4294967297_1", "a_b_c_1_00"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	g := &pb.RewardGrant{OrderNo: n.String(), ActId: "a1", SceneId: "s1", RainId: "r9", AwardType: pb.AwardType_CASH, Stage: 2}
	if err := Check(g); err != nil {
		t.Fatal(err)
	}
	g.Stage = 3
	if err := Check(g); err == nil {
		t.Fatal("mismatched order number accepted")
	}
}
