package ledger

import (
	"testing"

	pb "surge/schemas/surgev1"
	"surge/schemas/wire"
)

// TestMarshalEntryIsTheProtobufEncoding: the hand-written encoding is byte
// for byte proto.Marshal's deterministic one, for whole entries and for
// each field set alone (a field added to the schema and not to
// marshalEntry fails here).
func TestMarshalEntryIsTheProtobufEncoding(t *testing.T) {
	entries := []*pb.LedgerEntry{
		{},
		{OrderNo: "u1_rain_r1_1_1", ActId: "u1", Amount: 88, Kind: pb.LedgerKind_GRANT, BookedAtMs: 1796000000000,
			ActivityId: "spring-live", SceneId: "rain", BalanceAfter: 188, GrantedAtMs: 1795999999000},
		{OrderNo: "w:x", ActId: "只有中文", Amount: -500, Kind: pb.LedgerKind_WITHDRAW, BalanceAfter: -1, GrantedAtMs: -7},
		{Kind: pb.LedgerKind(-3), Amount: 1 << 62},
	}
	bad, err := wire.Mismatches(marshalEntry, entries...)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range bad {
		t.Error(m)
	}
}
