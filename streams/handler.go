package streams

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
)

// Handler turns one input record into zero or more outputs. It must be
// deterministic in its outputs for a given input and state, because a batch
// may be replayed after an abort. Return a *RejectError (Reject) for input
// that can never succeed; any other error is retried.
type Handler func(ctx context.Context, in *kgo.Record, out *Output) error

// Output collects what a handler emits for the batch in flight.
type Output struct {
	recs []*kgo.Record
}

// Emit queues a record for production with the batch.
func (o *Output) Emit(r *kgo.Record) { o.recs = append(o.recs, r) }

// EmitMsg encodes msg with its schema headers and queues it.
func (o *Output) EmitMsg(topic string, key []byte, msg proto.Message) error {
	r, err := NewRecord(topic, key, msg)
	if err != nil {
		return err
	}
	o.Emit(r)
	return nil
}

// Records are the records queued so far (data-driven tests print them).
func (o *Output) Records() []*kgo.Record { return o.recs }

// Len is the number of records queued.
func (o *Output) Len() int { return len(o.recs) }

func (o *Output) reset() { o.recs = o.recs[:0] }

// Typed adapts a handler of one protobuf message type: the runtime decodes
// and schema-checks the input, and dead-letters what does not decode.
func Typed[M any, PM interface {
	*M
	proto.Message
}](fn func(ctx context.Context, in *kgo.Record, msg PM, out *Output) error) Handler {
	return func(ctx context.Context, in *kgo.Record, out *Output) error {
		msg := PM(new(M))
		if err := Decode(in, msg); err != nil {
			return err
		}
		return fn(ctx, in, msg, out)
	}
}
