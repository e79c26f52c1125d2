package clickhouse

import (
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"surge/schemas"
	"surge/streams"
)

// FieldRows returns a sink's Write for a table whose columns are fields of
// msg, one row per record: fields names them in column order. It walks
// the record's protobuf encoding straight into RowBinary, without building
// the message: decoding into Go values (a string allocated per field, then
// copied again into the row) was a quarter of a sink's time
// (bench/sinks-notes.md).
//
// It refuses what proto.Unmarshal refuses (a malformed encoding, a string
// that is not UTF-8), and reads what it
// reads: the last value of a field that occurs twice, zero for a field
// that is absent, an unknown enum number as its decimal string, unknown
// fields (and fields of an unexpected wire type) skipped. TestFieldRowsMatchesProtobuf holds it to that.
//
// Column and field kinds must agree (String: string or enum, Int64: int64,
// UInt64: uint64, UInt8: bool); anything else panics when the sink is
// built, a programming error the sink tests catch.
func FieldRows(msg proto.Message, cols []Column, fields ...string) func(*kgo.Record, *RowWriter) error {
	return newWireRows(msg, cols, fields...).write
}

// newWireRows builds FieldRows' reader.
func newWireRows(msg proto.Message, cols []Column, fields ...string) *wireRows {
	d := &wireRows{schema: schemas.Of(msg)}
	md := msg.ProtoReflect().Descriptor()
	if len(fields) != len(cols) {
		panic(fmt.Sprintf("clickhouse: %d fields for %d columns of %s", len(fields), len(cols), md.FullName()))
	}
	for i, name := range fields {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil || fd.IsList() || fd.IsMap() || fd.ContainingOneof() != nil {
			panic(fmt.Sprintf("clickhouse: %s has no plain field %q", md.FullName(), name))
		}
		f := wireField{num: fd.Number(), name: name}
		switch {
		case cols[i].Type == String && fd.Kind() == protoreflect.StringKind:
			f.kind = wireString
		case cols[i].Type == String && fd.Kind() == protoreflect.EnumKind:
			f.kind, f.enum = wireEnum, fd.Enum().Values()
		case cols[i].Type == Int64 && fd.Kind() == protoreflect.Int64Kind:
			f.kind = wireInt64
		case cols[i].Type == UInt64 && fd.Kind() == protoreflect.Uint64Kind:
			f.kind = wireUint64
		case cols[i].Type == UInt8 && fd.Kind() == protoreflect.BoolKind:
			f.kind = wireBool
		default:
			panic(fmt.Sprintf("clickhouse: column %s (type %d) cannot take %s field %s", cols[i].Name, cols[i].Type, fd.Kind(), name))
		}
		d.setColumn(f.num, int8(i+1))
		d.fields = append(d.fields, f)
	}
	// Protobuf refuses a record whose strings are not UTF-8, kept or not,
	// at any depth: strings the table does not keep are checked, and so
	// are nested messages (a token's grant). Lists it checks element by
	// element, which this walk does not do: such messages are decoded the
	// usual way.
	for i := 0; i < md.Fields().Len(); i++ {
		fd := md.Fields().Get(i)
		if fd.IsList() || fd.IsMap() || fd.Kind() == protoreflect.GroupKind {
			panic(fmt.Sprintf("clickhouse: %s has the repeated field %s; FieldRows reads messages without lists", md.FullName(), fd.Name()))
		}
		switch {
		case fd.Kind() == protoreflect.StringKind && d.col(fd.Number()) < 0:
			d.setColumn(fd.Number(), checkOnly)
		case fd.Kind() == protoreflect.MessageKind:
			d.setColumn(fd.Number(), checkMessage)
			if d.nested == nil {
				d.nested = map[protowire.Number]protoreflect.MessageDescriptor{}
			}
			d.nested[fd.Number()] = fd.Message()
		}
	}
	if len(d.fields) > maxWireFields {
		panic(fmt.Sprintf("clickhouse: %d fields; FieldRows takes up to %d", len(d.fields), maxWireFields))
	}
	return d
}

const maxWireFields = 32

type wireKind uint8

const (
	wireString wireKind = iota + 1
	wireEnum
	wireInt64
	wireUint64
	wireBool
)

type wireField struct {
	num  protowire.Number
	name string
	kind wireKind
	enum protoreflect.EnumValueDescriptors
}

func (f *wireField) wireType() protowire.Type {
	if f.kind == wireString {
		return protowire.BytesType
	}
	return protowire.VarintType
}

type wireRows struct {
	schema schemas.Schema
	fields []wireField // in column order
	column []int8      // field number -> 1 + index in fields; checkOnly; checkMessage; 0 for other fields
	nested map[protowire.Number]protoreflect.MessageDescriptor
}

// checkOnly marks a string field the table does not keep: only its UTF-8
// is checked. checkMessage marks a nested message: only its encoding is
// checked (validMessage).
const (
	checkOnly    = -1
	checkMessage = -2
)

// setColumn records what field number num is to the table.
func (d *wireRows) setColumn(num protowire.Number, v int8) {
	if int(num) >= len(d.column) {
		d.column = append(d.column, make([]int8, int(num)+1-len(d.column))...)
	}
	d.column[num] = v
}

// col is the column a field number fills, or -1.
func (d *wireRows) col(num protowire.Number) int {
	if int(num) < len(d.column) && d.column[num] > 0 {
		return int(d.column[num]) - 1
	}
	return -1
}

func (d *wireRows) reject(what string, err error) error {
	return streams.Reject(fmt.Sprintf("malformed %s: %s", d.schema.Name, what), err)
}

func (d *wireRows) write(r *kgo.Record, w *RowWriter) error {
	if err := streams.CheckSchema(r, d.schema); err != nil {
		return err
	}
	return d.writeValue(r.Value, w)
}

// writeValue writes the row of an encoded message whose schema is known
// (a message nested in a record, such as a token's grant).
func (d *wireRows) writeValue(v []byte, w *RowWriter) error {
	var strs [maxWireFields][]byte
	var nums [maxWireFields]uint64
	for b := v; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return d.reject("bad field tag", protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return d.reject(fmt.Sprintf("field number %d", num), nil)
		}
		b = b[n:]
		i := d.col(num)
		// A field the table does not keep (or a newer one), or one of an
		// unexpected wire type, which protobuf also keeps as unknown.
		if i < 0 || typ != d.fields[i].wireType() {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return d.reject(fmt.Sprintf("field %d", num), protowire.ParseError(n))
			}
			if i < 0 && typ == protowire.BytesType && int(num) < len(d.column) {
				switch v, _ := protowire.ConsumeBytes(b); d.column[num] {
				case checkOnly:
					if !utf8.Valid(v) {
						return d.reject(fmt.Sprintf("field %d is not valid UTF-8", num), nil)
					}
				case checkMessage:
					if err := validMessage(v, d.nested[num]); err != nil {
						return d.reject(fmt.Sprintf("field %d", num), err)
					}
				}
			}
			b = b[n:]
			continue
		}
		f := &d.fields[i]
		if f.kind == wireString {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return d.reject("field "+f.name, protowire.ParseError(n))
			}
			if !utf8.Valid(v) {
				return d.reject("field "+f.name+" is not valid UTF-8", nil)
			}
			strs[i], b = v, b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return d.reject("field "+f.name, protowire.ParseError(n))
		}
		nums[i], b = v, b[n:]
	}
	for i := range d.fields {
		switch f := &d.fields[i]; f.kind {
		case wireString:
			w.StrBytes(strs[i])
		case wireEnum:
			w.Str(enumName(f.enum, int32(nums[i])))
		case wireInt64:
			w.I64(int64(nums[i]))
		case wireUint64:
			w.U64(nums[i])
		case wireBool:
			w.Bool(nums[i] != 0)
		}
	}
	w.EndRow()
	return nil
}

// validMessage refuses what proto.Unmarshal refuses in an encoded message
// of type md: a malformed field, or a string that is not UTF-8, at any
// depth. A message with lists or maps is decoded by protobuf itself.
func validMessage(b []byte, md protoreflect.MessageDescriptor) error {
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		if fd := fields.Get(i); fd.IsList() || fd.IsMap() || fd.Kind() == protoreflect.GroupKind {
			return proto.Unmarshal(b, dynamicpb.NewMessage(md))
		}
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("field number %d", num)
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return protowire.ParseError(n)
		}
		if fd := fields.ByNumber(num); fd != nil && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			switch fd.Kind() {
			case protoreflect.StringKind:
				if !utf8.Valid(v) {
					return fmt.Errorf("field %s is not valid UTF-8", fd.Name())
				}
			case protoreflect.MessageKind:
				if err := validMessage(v, fd.Message()); err != nil {
					return err
				}
			}
		}
		b = b[n:]
	}
	return nil
}

// enumName is what the generated String method gives: the value's name,
// or its number for a value this build does not know.
func enumName(vals protoreflect.EnumValueDescriptors, n int32) string {
	if v := vals.ByNumber(protoreflect.EnumNumber(n)); v != nil {
		return string(v.Name())
	}
	return strconv.Itoa(int(n))
}
