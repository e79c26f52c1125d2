package clickhouse_test

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	"surge/sinks/clickhouse"
	"surge/streams"
)

// FuzzSinkRows: every fact sink reads any value as a row (the same row
// protobuf would give, for the sinks that walk the encoding themselves)
// or rejects it for the dead-letter topic; none panics.
func FuzzSinkRows(f *testing.F) {
	facts := clickhouse.Facts()
	all := schemas.All()
	for i, s := range facts {
		for j, sc := range all {
			if s.Message == nil || sc.Name == schemas.Of(s.Message).Name {
				b, _ := proto.Marshal(sc.New())
				f.Add(uint8(i), uint8(j), b)
			}
		}
		f.Add(uint8(i), uint8(0), []byte{0x0a, 0x02, 0xff, 0xfe})
	}
	f.Fuzz(func(t *testing.T, which, schema uint8, value []byte) {
		s := facts[int(which)%len(facts)]
		r := &kgo.Record{Topic: s.Topic, Value: value}
		// A sink that reads its own way reads whatever schema it is
		// given: the fuzzer picks one.
		sc := all[int(schema)%len(all)]
		if s.Message != nil {
			sc = schemas.Of(s.Message)
		}
		r.Headers = []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: sc.NameHeader()}, {Key: schemas.HeaderVersion, Value: sc.VersionHeader()}}
		w := clickhouse.NewRowWriter(s.Columns)
		err := s.Write(r, w)
		if err != nil && !streams.IsReject(err) {
			t.Fatalf("%s: %v is not a rejection", s.Name, err)
		}
		if s.Fields == nil {
			return
		}
		want, wantErr := referenceRow(t, s, r)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%s: sink error %v, protobuf error %v (value %x)", s.Name, err, wantErr, value)
		}
		if err == nil && !bytes.Equal(w.Bytes(), want) {
			t.Fatalf("%s: row %x, protobuf's %x (value %x)", s.Name, w.Bytes(), want, value)
		}
	})
}
