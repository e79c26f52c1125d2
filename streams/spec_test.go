package streams_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/streamstest"
)

// A processor runs as its spec declares: it consumes the declared inputs
// behind its namespace, produces to declared outputs (families included),
// and stops with an UndeclaredError, committing nothing of the batch,
// when it produces anywhere else.
func TestDeclaredSpecRefusesUndeclaredOutputs(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns := streamstest.Unique("spec") + "."
		in, fam, stray, dlq := ns+"in", ns+"out.e1", ns+"stray", ns+"dlq"
		streamstest.CreateTopics(t, b.Kafka, 1, in, fam, stray, dlq)
		spec := streams.Spec{Name: "echo", Group: "echo", Guarantee: streams.ExactlyOnce,
			Inputs: []string{"in"}, Outputs: []string{"out.*"}}
		cl := streamstest.Client(t, b.Kafka)
		streamstest.ProduceSync(t, cl, loginRecord(t, in, 1), loginRecord(t, in, 2))

		// Uin 1 goes to the declared family, uin 2 to a stray topic.
		h := func(ctx context.Context, r *kgo.Record, o *streams.Output) error {
			to := fam
			if r.Key[3] == 2 {
				to = stray
			}
			return echo(to)(ctx, r, o)
		}
		r, err := streams.New("echo", h, streams.Declare(spec, ns), streams.Kafka(b.Kafka),
			streams.DeadLetterTopic(dlq), streams.Logger(quiet), streams.MaxBatch(1))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		err = r.Run(ctx)
		var ue *streams.UndeclaredError
		if !errors.As(err, &ue) || ue.Topic != stray {
			t.Fatalf("Run = %v, want an UndeclaredError for %s", err, stray)
		}
		if got := streamstest.ReadN(t, b.Kafka, fam, true, 1, 10*time.Second, 300*time.Millisecond); len(got) != 1 {
			t.Fatalf("declared family output: %d records, want 1", len(got))
		}
		if got := streamstest.ReadN(t, b.Kafka, stray, true, 0, time.Second, time.Second); len(got) != 0 {
			t.Fatalf("undeclared topic got %d committed records", len(got))
		}

		// An Inputs option outside the spec is refused at construction.
		_, err = streams.New("echo", h, streams.Declare(spec, ns), streams.Kafka(b.Kafka), streams.Inputs(stray))
		if err == nil || !strings.Contains(err.Error(), "does not declare") {
			t.Fatalf("undeclared input: %v", err)
		}
	})
}
