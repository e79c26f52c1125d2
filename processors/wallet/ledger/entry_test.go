package ledger

import (
	"math"
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

// The store's short form of an entry reads back as written, for every
// kind, sign and size, and a damaged one is refused.
func TestStoredEntryRoundTrips(t *testing.T) {
	for _, e := range []*pb.LedgerEntry{
		{},
		{Kind: pb.LedgerKind_GRANT, Amount: 88, BookedAtMs: 1796000000000},
		{Kind: pb.LedgerKind_WITHDRAW, Amount: -500, BookedAtMs: 1},
		{Kind: pb.LedgerKind(-3), Amount: math.MinInt64, BookedAtMs: math.MaxInt64},
	} {
		v := appendStoredEntry(nil, e)
		kind, amount, at, ok := parseStoredEntry(v)
		if !ok || kind != e.Kind || amount != e.Amount || at != e.BookedAtMs {
			t.Errorf("%v: read back %v %d %d %v", e, kind, amount, at, ok)
		}
		if _, _, _, ok := parseStoredEntry(v[:len(v)-1]); ok {
			t.Errorf("%v: a truncated form was accepted", e)
		}
		if _, _, _, ok := parseStoredEntry(append(v, 0)); ok {
			t.Errorf("%v: a form with a trailing byte was accepted", e)
		}
	}
}
