// Package order is the wallet's idempotency key: the order number
// {actID}_{sceneID}_{rainID}_{awardType}_{stage}. A grant books once per
// order number, whatever is replayed.
package order

import (
	"fmt"
	"strconv"
	"strings"

	pb "surge/schemas/surgev1"
)

// Number is a parsed order number.
type Number struct {
	ActID, SceneID, RainID string
	AwardType              pb.AwardType
	Stage                  uint32
}

// validPart: 1 to 64 of [A-Za-z0-9-] (checked byte by byte: a regexp was
// 6% of intake's CPU).
func validPart(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// canonical: a decimal without a sign or leading zeros. The order number
// is the grant's idempotency key, so each number has one spelling only:
// "01" beside "1" would be a second claim on the same reward.
func canonical(digits string) bool {
	return digits == "0" || len(digits) > 0 && digits[0] >= '1' && digits[0] <= '9'
}

// String formats the order number.
func (n Number) String() string {
	return fmt.Sprintf("%s_%s_%s_%d_%d", n.ActID, n.SceneID, n.RainID, n.AwardType, n.Stage)
}

// Parse checks and splits an order number.
func Parse(s string) (Number, error) {
	f := strings.Split(s, "_")
	if len(f) != 5 {
		return Number{}, fmt.Errorf("order number %q: want actID_sceneID_rainID_awardType_stage", s)
	}
	for i, name := range []string{"actID", "sceneID", "rainID"} {
		if !validPart(f[i]) {
			return Number{}, fmt.Errorf("order number %q: bad %s %q", s, name, f[i])
		}
	}
	at, err := strconv.ParseUint(f[3], 10, 31)
	if err != nil || !canonical(f[3]) || pb.AwardType_name[int32(at)] == "" || at == 0 {
		return Number{}, fmt.Errorf("order number %q: unknown award type %q", s, f[3])
	}
	st, err := strconv.ParseUint(f[4], 10, 32)
	if err != nil || !canonical(f[4]) {
		return Number{}, fmt.Errorf("order number %q: bad stage %q", s, f[4])
	}
	return Number{ActID: f[0], SceneID: f[1], RainID: f[2], AwardType: pb.AwardType(at), Stage: uint32(st)}, nil
}

// Check verifies that a grant's order number is the one its fields make.
func Check(g *pb.RewardGrant) error {
	n, err := Parse(g.OrderNo)
	if err != nil {
		return err
	}
	want := Number{ActID: g.ActId, SceneID: g.SceneId, RainID: g.RainId, AwardType: g.AwardType, Stage: g.Stage}
	if n != want {
		return fmt.Errorf("order number %q does not match the grant (want %q)", g.OrderNo, want)
	}
	return nil
}
