package streamstest

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"surge/schemas"
	_ "surge/schemas/surgev1" // registers the record types
)

// Describe renders a record on one line, the same way every run, for
// data-driven tests: "topic key: field=value ..." with the set fields in
// field-number order. The topic loses the namespace ns; a 4-byte key
// prints as a uin; times (fields ending in _ms at or after epoch) print
// as offsets from epoch; a tombstone prints as "(tombstone)".
func Describe(r *kgo.Record, ns string, epoch time.Time) string {
	key := fmt.Sprintf("%q", r.Key)
	if len(r.Key) == 4 {
		key = fmt.Sprint(binary.BigEndian.Uint32(r.Key))
	}
	head := strings.TrimPrefix(r.Topic, ns) + " " + key + ":"
	if r.Value == nil {
		return head + " (tombstone)"
	}
	var name string
	for _, h := range r.Headers {
		if h.Key == schemas.HeaderSchema {
			name, _, _ = strings.Cut(string(h.Value), ";")
		}
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return fmt.Sprintf("%s %d bytes of %q", head, len(r.Value), name)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(r.Value, m); err != nil {
		return fmt.Sprintf("%s undecodable %s: %v", head, name, err)
	}
	return head + describeMessage(m.ProtoReflect(), epoch)
}

func describeMessage(m protoreflect.Message, epoch time.Time) string {
	var b strings.Builder
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		if !m.Has(f) {
			continue
		}
		v := m.Get(f)
		var s string
		switch {
		case f.IsMap():
			s = fmt.Sprintf("%d entries", v.Map().Len())
		case f.IsList() && f.Kind() == protoreflect.MessageKind: // a batch: an entry a line
			l := v.List()
			s = fmt.Sprintf("%d items", l.Len())
			for j := 0; j < l.Len(); j++ {
				s += "\n  - " + strings.TrimSpace(describeMessage(l.Get(j).Message(), epoch))
			}
		case f.IsList():
			s = fmt.Sprintf("%d items", v.List().Len())
		case f.Kind() == protoreflect.MessageKind:
			s = "{" + strings.TrimSpace(describeMessage(v.Message(), epoch)) + "}"
		case f.Kind() == protoreflect.BytesKind:
			s = fmt.Sprintf("%d bytes", len(v.Bytes()))
		case f.Kind() == protoreflect.EnumKind:
			if ev := f.Enum().Values().ByNumber(v.Enum()); ev != nil {
				s = string(ev.Name())
			} else {
				s = fmt.Sprint(v.Enum())
			}
		case strings.HasSuffix(string(f.Name()), "_ms") && f.Kind() == protoreflect.Int64Kind && v.Int() >= epoch.UnixMilli():
			s = "+" + (time.Duration(v.Int()-epoch.UnixMilli()) * time.Millisecond).String()
		case f.Kind() == protoreflect.StringKind:
			s = fmt.Sprintf("%q", v.String())
		default:
			s = v.String()
		}
		fmt.Fprintf(&b, " %s=%s", f.Name(), s)
	}
	return b.String()
}
