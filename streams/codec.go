package streams

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
)

// NewRecord encodes msg as a record for topic, with the schema headers.
func NewRecord(topic string, key []byte, msg proto.Message) (*kgo.Record, error) {
	v, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("streams: encode %s: %w", schemas.Of(msg).Name, err)
	}
	return NewEncodedRecord(topic, key, msg, v), nil
}

// NewEncodedRecord is NewRecord for a message already encoded as value (by
// a hand-written encoder, such as token.Marshal); msg names the schema.
func NewEncodedRecord(topic string, key []byte, msg proto.Message, value []byte) *kgo.Record {
	s := schemas.Of(msg)
	return &kgo.Record{
		Topic: topic,
		Key:   key,
		Value: value,
		Headers: []kgo.RecordHeader{
			{Key: schemas.HeaderSchema, Value: s.NameHeader()},
			{Key: schemas.HeaderVersion, Value: s.VersionHeader()},
		},
	}
}

// Header returns the value of the first header named key.
func Header(r *kgo.Record, key string) (string, bool) {
	v, ok := headerBytes(r, key)
	return string(v), ok
}

// HasSchema reports whether r carries the schema named name, without
// copying the header (it is asked of every record on mixed topics).
func HasSchema(r *kgo.Record, name string) bool {
	v, ok := headerBytes(r, schemas.HeaderSchema)
	return ok && string(v) == name
}

func headerBytes(r *kgo.Record, key string) ([]byte, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

// Decode checks that r carries into's schema at a readable version and
// unmarshals it. Every failure is a *RejectError: such a record can never
// be read by this build, so it belongs in the dead-letter topic.
func Decode(r *kgo.Record, into proto.Message) error {
	want := schemas.Of(into)
	if err := CheckSchema(r, want); err != nil {
		return err
	}
	if err := proto.Unmarshal(r.Value, into); err != nil {
		return Reject("malformed "+want.Name, err)
	}
	return nil
}

// CheckSchema is Decode's check of the headers alone, for readers that
// walk the encoded value themselves (the ClickHouse sinks).
func CheckSchema(r *kgo.Record, want schemas.Schema) error {
	name, ok := headerBytes(r, schemas.HeaderSchema)
	if !ok {
		return Reject("missing schema header", nil)
	}
	if string(name) != want.Name {
		return Reject(fmt.Sprintf("schema %q where %q expected", name, want.Name), nil)
	}
	// The common case, this build's own version, is a byte comparison.
	if vs, _ := headerBytes(r, schemas.HeaderVersion); !bytes.Equal(vs, want.VersionHeader()) {
		v, err := strconv.Atoi(string(vs))
		if err != nil {
			return Reject(fmt.Sprintf("bad schema version %q", vs), nil)
		}
		if !want.Accepts(v) {
			return Reject(fmt.Sprintf("unknown schema version %d of %s (reads %d..%d)", v, name, want.MinVersion, want.Version), nil)
		}
	}
	return nil
}
