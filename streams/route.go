package streams

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
)

// Input is one topic a processor consumes, with the message its records
// carry and the handler of a decoded record: goka's
// DefineGroup(Input(topic, codec, callback), ...). Route dispatches a
// processor's records to its inputs, so no processor switches on topic
// names, and checks them against the processor's Spec.
type Input struct {
	Topic  string // as in Spec.Inputs: a registry name, or a family ("push.units.*")
	handle Handler
}

// On declares an input whose records carry M: the runtime decodes and
// schema-checks each record (Decode) and dead-letters one that does not
// decode, with the reason; fn gets the message.
func On[M any, PM interface {
	*M
	proto.Message
}](topic string, fn func(ctx context.Context, in *kgo.Record, msg PM, out *Output) error) Input {
	return Input{Topic: topic, handle: Typed(fn)}
}

// OnRecord declares an input fn decodes itself: a topic whose records
// carry one of several schemas (uin.recycle-steps: a step or a batch).
func OnRecord(topic string, fn Handler) Input { return Input{Topic: topic, handle: fn} }

// Route is the handler of spec's inputs behind namespace ns: each record
// goes to the input of its topic. The inputs must be exactly the spec's
// (one each): a declared topic without a handler, a handler of a topic the
// spec does not declare, or one declared twice is an error, found when the
// processor is built rather than by a record that has nowhere to go. A
// record of another topic is dead-lettered.
func Route(spec Spec, ns string, inputs ...Input) (Handler, error) {
	exact := map[string]Handler{}
	type family struct {
		prefix string
		handle Handler
	}
	var families []family
	var seen []string
	for _, in := range inputs {
		if !slices.Contains(spec.Inputs, in.Topic) {
			return nil, fmt.Errorf("streams: %s handles %q, which its spec does not declare (inputs %v)", spec.Name, in.Topic, spec.Inputs)
		}
		if slices.Contains(seen, in.Topic) {
			return nil, fmt.Errorf("streams: %s handles %q twice", spec.Name, in.Topic)
		}
		seen = append(seen, in.Topic)
		if fam, ok := strings.CutSuffix(in.Topic, ".*"); ok {
			families = append(families, family{ns + fam + ".", in.handle})
		} else {
			exact[ns+in.Topic] = in.handle
		}
	}
	for _, t := range spec.Inputs {
		if !slices.Contains(seen, t) {
			return nil, fmt.Errorf("streams: %s declares input %q and has no handler for it", spec.Name, t)
		}
	}
	return func(ctx context.Context, in *kgo.Record, out *Output) error {
		if h, ok := exact[in.Topic]; ok {
			return h(ctx, in, out)
		}
		for _, f := range families {
			if strings.HasPrefix(in.Topic, f.prefix) {
				return f.handle(ctx, in, out)
			}
		}
		return Reject("no input declared for topic "+in.Topic, nil)
	}, nil
}
