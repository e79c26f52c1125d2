package ledger

import (
	"encoding/binary"

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

// appendStoredEntry appends what the store keeps of an entry under its key
// (which already holds the user and the order number): the kind, amount
// and booking time the flow list shows. The whole entry is on
// wallet.ledger. Keeping the whole entry moved about three times the
// bytes through Pebble's flushes and compactions, the largest part of a
// booking's CPU (bench/wallet-notes.md).
func appendStoredEntry(b []byte, e *pb.LedgerEntry) []byte {
	b = binary.AppendVarint(b, int64(e.Kind))
	b = binary.AppendVarint(b, e.Amount)
	return binary.AppendVarint(b, e.BookedAtMs)
}

// parseStoredEntry reads appendStoredEntry's encoding.
func parseStoredEntry(v []byte) (kind pb.LedgerKind, amount, atMs int64, ok bool) {
	var k int64
	for _, dst := range []*int64{&k, &amount, &atMs} {
		x, n := binary.Varint(v)
		if n <= 0 {
			return 0, 0, 0, false
		}
		*dst, v = x, v[n:]
	}
	return pb.LedgerKind(k), amount, atMs, len(v) == 0
}
