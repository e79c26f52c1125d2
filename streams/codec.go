package streams

import (
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
)

// NewRecord encodes msg as a record for topic, with the schema headers.
func NewRecord(topic string, key []byte, msg proto.Message) (*kgo.Record, error) {
	s := schemas.Of(msg)
	v, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("streams: encode %s: %w", s.Name, err)
	}
	return &kgo.Record{
		Topic: topic,
		Key:   key,
		Value: v,
		Headers: []kgo.RecordHeader{
			{Key: schemas.HeaderSchema, Value: []byte(s.Name)},
			{Key: schemas.HeaderVersion, Value: []byte(strconv.Itoa(s.Version))},
		},
	}, nil
}

// Header returns the value of the first header named key.
func Header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// Decode checks that r carries into's schema at a readable version and
// unmarshals it. Every failure is a *RejectError: such a record can never
// be read by this build, so it belongs in the dead-letter topic.
func Decode(r *kgo.Record, into proto.Message) error {
	want := schemas.Of(into)
	name, ok := Header(r, schemas.HeaderSchema)
	if !ok {
		return Reject("missing schema header", nil)
	}
	if name != want.Name {
		return Reject(fmt.Sprintf("schema %q where %q expected", name, want.Name), nil)
	}
	vs, _ := Header(r, schemas.HeaderVersion)
	v, err := strconv.Atoi(vs)
	if err != nil {
		return Reject(fmt.Sprintf("bad schema version %q", vs), nil)
	}
	if !want.Accepts(v) {
		return Reject(fmt.Sprintf("unknown schema version %d of %s (reads %d..%d)", v, name, want.MinVersion, want.Version), nil)
	}
	if err := proto.Unmarshal(r.Value, into); err != nil {
		return Reject("malformed "+name, err)
	}
	return nil
}
