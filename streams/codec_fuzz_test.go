package streams

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
)

// FuzzDecode: every record type, read from any bytes under any schema
// headers, decodes or is rejected (for the dead-letter topic); it never
// panics, and what decodes encodes and decodes again to the same message.
func FuzzDecode(f *testing.F) {
	all := schemas.All()
	for i, s := range all {
		sample := s.New()
		b, _ := proto.Marshal(sample)
		f.Add(uint8(i), s.Name, "1", b)
		f.Add(uint8(i), s.Name, "99", []byte{0x0a, 0x02, 0xff, 0xfe})
	}
	f.Add(uint8(0), "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, which uint8, name, version string, value []byte) {
		s := all[int(which)%len(all)]
		r := &kgo.Record{Value: value, Headers: []kgo.RecordHeader{
			{Key: schemas.HeaderSchema, Value: []byte(name)},
			{Key: schemas.HeaderVersion, Value: []byte(version)},
		}}
		msg := s.New()
		err := Decode(r, msg)
		if err != nil {
			if !IsReject(err) {
				t.Fatalf("%s: %v is not a rejection (the record would not be dead-lettered)", s.Name, err)
			}
			return
		}
		again, err := proto.Marshal(msg)
		if err != nil {
			t.Fatalf("%s decoded but does not encode: %v", s.Name, err)
		}
		back := s.New()
		if err := proto.Unmarshal(again, back); err != nil || !proto.Equal(msg, back) {
			t.Fatalf("%s: re-encoded record reads as %v (%v), was %v", s.Name, back, err, msg)
		}
	})
}
