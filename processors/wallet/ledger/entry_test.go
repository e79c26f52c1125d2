package ledger

import (
	"testing"

	"google.golang.org/protobuf/proto"

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
	alone, err := wire.EachFieldAlone(&pb.LedgerEntry{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range alone {
		entries = append(entries, f.Msg.(*pb.LedgerEntry))
	}
	for i, e := range entries {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if got := marshalEntry(e); string(got) != string(want) {
			t.Errorf("entry %d: marshalEntry\n%x\nwant the protobuf encoding\n%x", i, got, want)
		}
	}
}
