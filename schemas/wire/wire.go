// Package wire appends protobuf fields by hand, the way proto3 encodes
// them: zero values are omitted, and the caller writes fields in field
// number order so the bytes are proto.Marshal's deterministic encoding.
// The wallet's hot encoders use it (token.Marshal, the grant inside a
// token's record, the ledger's entry),
// each held to proto.Marshal by a test over EachFieldAlone.
package wire

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// String appends a string field unless it is empty.
func String(b []byte, num protowire.Number, v string) []byte {
	if v == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// Bytes appends a bytes field unless it is empty.
func Bytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// Varint appends a varint field (int64, uint32, or an enum converted
// through int64 so negative values are sign-extended) unless it is 0.
func Varint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// FieldAlone is a message of m's type with one field set.
type FieldAlone struct {
	Name protoreflect.Name
	Msg  proto.Message
}

// EachFieldAlone returns, for every field of m's type, a new message with
// only that field set to a non-zero value: a test comparing a hand-written
// encoder with proto.Marshal over them fails when the schema gains a field
// the encoder does not write.
func EachFieldAlone(m proto.Message) ([]FieldAlone, error) {
	fields := m.ProtoReflect().Descriptor().Fields()
	out := make([]FieldAlone, 0, fields.Len())
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		c := m.ProtoReflect().New()
		switch f.Kind() {
		case protoreflect.StringKind:
			c.Set(f, protoreflect.ValueOfString("x"))
		case protoreflect.BytesKind:
			c.Set(f, protoreflect.ValueOfBytes([]byte{1}))
		case protoreflect.Int64Kind:
			c.Set(f, protoreflect.ValueOfInt64(1))
		case protoreflect.Uint32Kind:
			c.Set(f, protoreflect.ValueOfUint32(1))
		case protoreflect.EnumKind:
			c.Set(f, protoreflect.ValueOfEnum(1))
		case protoreflect.BoolKind:
			c.Set(f, protoreflect.ValueOfBool(true))
		case protoreflect.MessageKind: // present and empty
			c.Set(f, protoreflect.ValueOfMessage(c.NewField(f).Message()))
		default:
			return nil, fmt.Errorf("wire: field %s of kind %s: extend EachFieldAlone", f.Name(), f.Kind())
		}
		out = append(out, FieldAlone{Name: f.Name(), Msg: c.Interface()})
	}
	return out, nil
}

// Mismatches holds a hand-written encoder to proto.Marshal's deterministic
// encoding: it encodes the samples, and one message per field of their
// type (EachFieldAlone), both ways, and describes each difference. At
// least one sample is needed (it names the type).
func Mismatches[M proto.Message](encode func(M) []byte, samples ...M) ([]string, error) {
	if len(samples) == 0 {
		return nil, fmt.Errorf("wire: Mismatches needs a sample")
	}
	alone, err := EachFieldAlone(samples[0])
	if err != nil {
		return nil, err
	}
	for _, f := range alone {
		samples = append(samples, f.Msg.(M))
	}
	var out []string
	for i, m := range samples {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		if got := encode(m); string(got) != string(want) {
			out = append(out, fmt.Sprintf("message %d: hand-written\n%x\nwant the protobuf encoding\n%x", i, got, want))
		}
	}
	return out, nil
}
