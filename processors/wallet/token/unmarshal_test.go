package token

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "surge/schemas/surgev1"
	"surge/schemas/wire"
)

// unmarshalSamples are encoded tokens: signed ones, each field alone,
// odd values, and fields the schema does not know.
func unmarshalSamples(t testing.TB) [][]byte {
	k, _ := Generate("k1")
	batch := batchOf(5)
	k.SignBatch(batch)
	toks := []*pb.Token{{}, batch[0], batch[4],
		{ActId: "只有中文", Amount: -5, OpenTime: -1, Status: pb.TokenStatus_SUCCESS, Signature: []byte{1}, BatchIndex: 3, BatchProof: []byte{2}},
		{AppId: string(make([]byte, 300)), Amount: 1 << 62, KeyId: "k", Status: pb.TokenStatus(-1), BatchIndex: 1 << 31},
	}
	alone, err := wire.EachFieldAlone(&pb.Token{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range alone {
		toks = append(toks, f.Msg.(*pb.Token))
	}
	var out [][]byte
	for _, tok := range toks {
		b, err := proto.Marshal(tok)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	// A newer schema's fields (varint 14, bytes 15, fixed64 16, fixed32
	// 17), a known field with a wire type that is not its own, and a
	// field repeated (the last one wins).
	unknown := append([]byte{14 << 3, 1, 15<<3 | 2, 2, 'h', 'i', 16<<3 | 1, 1, 2, 3, 4, 5, 6, 7, 8, 17<<3 | 5, 1, 2, 3, 4}, out[1]...)
	wrongType := append([]byte{5<<3 | 2, 1, 'x', 2<<3 | 0, 7}, out[1]...)
	repeated := append(append([]byte{}, out[1]...), 2<<3|2, 3, 'n', 'e', 'w', 5<<3, 9)
	return append(out, unknown, wrongType, repeated, []byte{2<<3 | 2, 2, 0xff, 0xfe} /* not UTF-8 */)
}

// sameAsProto reports whether Unmarshal and proto.Unmarshal agree on b:
// both refuse it, or both decode the same known fields. Unmarshal skips
// the grant (field 14), so it is held to proto.Unmarshal of b without it.
func sameAsProto(t testing.TB, b []byte) {
	t.Helper()
	var got, want pb.Token
	gotErr, wantErr := Unmarshal(b, &got), proto.Unmarshal(withoutGrant(b), &want)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("%x: Unmarshal error %v, proto.Unmarshal error %v", b, gotErr, wantErr)
	}
	if gotErr != nil {
		return
	}
	want.ProtoReflect().SetUnknown(nil) // Unmarshal drops unknown fields
	if !proto.Equal(&got, &want) {
		t.Fatalf("%x: Unmarshal gave\n%v\nproto.Unmarshal gave\n%v", b, &got, &want)
	}
}

// withoutGrant is b with its top-level bytes fields 14 (the grant)
// dropped; b itself when it does not parse (both decoders refuse it then).
func withoutGrant(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return b
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return b
		}
		if num != grantField || typ != protowire.BytesType {
			out = append(out, b[i:i+n+m]...)
		}
		i += n + m
	}
	return out
}

// TestUnmarshalIsProtoUnmarshal holds Unmarshal to proto.Unmarshal on the
// samples, on every prefix of them (truncated input) and on random
// changes of their bytes.
func TestUnmarshalIsProtoUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, b := range unmarshalSamples(t) {
		sameAsProto(t, b)
		for n := range len(b) {
			sameAsProto(t, b[:n])
		}
		for range 300 {
			c := append([]byte{}, b...)
			if len(c) == 0 {
				break
			}
			for range 1 + rng.IntN(3) {
				c[rng.IntN(len(c))] = byte(rng.Uint32())
			}
			sameAsProto(t, c)
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, b := range unmarshalSamples(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { sameAsProto(t, b) })
}

func BenchmarkUnmarshal(b *testing.B) {
	k, _ := Generate("k1")
	batch := batchOf(BatchSize)
	k.SignBatch(batch)
	enc := Marshal(batch[7])
	b.Run("hand-written", func(b *testing.B) {
		for b.Loop() {
			var tok pb.Token
			if Unmarshal(enc, &tok) != nil {
				b.Fatal("unmarshal")
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			var tok pb.Token
			if proto.Unmarshal(enc, &tok) != nil {
				b.Fatal("unmarshal")
			}
		}
	})
}
