package ledger

import (
	"google.golang.org/protobuf/encoding/protowire"

	pb "surge/schemas/surgev1"
)

// marshalEntry is a ledger entry's deterministic protobuf encoding, written
// out by hand: every booking encodes one, for the store and wallet.ledger,
// and proto.Marshal was the largest part of that
// (TestMarshalEntryIsTheProtobufEncoding keeps the two equal). Field
// numbers are wallet.proto's; zero values are omitted, as proto3 does.
func marshalEntry(e *pb.LedgerEntry) []byte {
	b := make([]byte, 0, 48+len(e.OrderNo)+len(e.ActId)+len(e.ActivityId)+len(e.SceneId))
	str := func(b []byte, num protowire.Number, v string) []byte {
		if v == "" {
			return b
		}
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		if v == 0 {
			return b
		}
		return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
	}
	b = str(b, 1, e.OrderNo)
	b = str(b, 2, e.ActId)
	b = varint(b, 3, uint64(e.Amount))
	b = varint(b, 4, uint64(int64(e.Kind))) // an enum is an int32 varint, sign-extended
	b = varint(b, 5, uint64(e.BookedAtMs))
	b = str(b, 6, e.ActivityId)
	b = str(b, 7, e.SceneId)
	b = varint(b, 8, uint64(e.BalanceAfter))
	return varint(b, 9, uint64(e.GrantedAtMs))
}
