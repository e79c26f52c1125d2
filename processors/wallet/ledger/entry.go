package ledger

import (
	pb "surge/schemas/surgev1"
	"surge/schemas/wire"
)

// marshalEntry is a ledger entry's deterministic protobuf encoding, written
// out by hand: every booking encodes one, for the store and wallet.ledger,
// and proto.Marshal was the largest part of that
// (TestMarshalEntryIsTheProtobufEncoding keeps the two equal). Field
// numbers are wallet.proto's.
func marshalEntry(e *pb.LedgerEntry) []byte {
	b := make([]byte, 0, 48+len(e.OrderNo)+len(e.ActId)+len(e.ActivityId)+len(e.SceneId))
	b = wire.String(b, 1, e.OrderNo)
	b = wire.String(b, 2, e.ActId)
	b = wire.Varint(b, 3, uint64(e.Amount))
	b = wire.Varint(b, 4, uint64(int64(e.Kind)))
	b = wire.Varint(b, 5, uint64(e.BookedAtMs))
	b = wire.String(b, 6, e.ActivityId)
	b = wire.String(b, 7, e.SceneId)
	b = wire.Varint(b, 8, uint64(e.BalanceAfter))
	return wire.Varint(b, 9, uint64(e.GrantedAtMs))
}
