package token

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	pb "surge/schemas/surgev1"
)

var (
	errInvalidUTF8 = errors.New("token: string field is not valid UTF-8")
	errFieldNumber = errors.New("token: invalid field number")
)

// Unmarshal decodes a token's protobuf encoding into t. It accepts and
// refuses what proto.Unmarshal does, and gives the same fields, but drops
// unknown fields instead of keeping them (nothing re-encodes a decoded
// token with them: Marshal and the signed bytes write the known fields),
// and skips the grant (field 14): its readers, the ledger and the balance
// reads, never look at it, and sink-cash-grants decodes it with protobuf
// (a malformed grant is dead-lettered there, its token still books).
// The ledger decodes every token it books, and proto.Unmarshal was 7% of
// its CPU (bench/wallet-notes.md). It makes one allocation for all the
// string fields; the bytes fields (signature, proof) alias b.
func Unmarshal(b []byte, t *pb.Token) error {
	t.Reset()
	all := string(b)
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return errFieldNumber
		}
		i += n
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(b[i:])
			if n < 0 {
				return protowire.ParseError(n)
			}
			i += n
			switch num {
			case 5:
				t.Amount = int64(v)
			case 7:
				t.OpenTime = int64(v)
			case 9:
				t.Status = pb.TokenStatus(int32(v))
			case 12:
				t.BatchIndex = uint32(v)
			}
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b[i:])
			if n < 0 {
				return protowire.ParseError(n)
			}
			at := i + n - len(v)
			i += n
			var s *string
			switch num {
			case 1:
				s = &t.AppId
			case 2:
				s = &t.ActId
			case 3:
				s = &t.ActivityId
			case 4:
				s = &t.SceneId
			case 6:
				s = &t.OutTradeNo
			case 8:
				s = &t.RainId
			case 10:
				s = &t.KeyId
			case 11:
				t.Signature = v
			case 13:
				t.BatchProof = v
			case grantField: // skipped: see above
			}
			if s != nil {
				if *s = all[at : at+len(v)]; !utf8.ValidString(*s) {
					return errInvalidUTF8
				}
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b[i:])
			if n < 0 {
				return protowire.ParseError(n)
			}
			i += n
		}
	}
	return nil
}
