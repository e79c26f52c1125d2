package streams_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"surge/schemas"
	"surge/streams"
	"surge/streams/streamstest"
)

// EnsureTopics creates a mix of new and existing topics in one call, each
// with its own partitions and cleanup policy, and leaves an existing one
// as it was.
func TestEnsureTopicsCreatesEachWithItsOwnConfig(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		cl := streamstest.Client(t, b.Kafka)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		existing := schemas.Topic{Name: streamstest.Unique("existing"), Partitions: 2, Retention: time.Hour}
		if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, existing); err != nil {
			t.Fatal(err)
		}
		compacted := schemas.Topic{Name: streamstest.Unique("compacted"), Partitions: 3, Compacted: true}
		kept := schemas.Topic{Name: streamstest.Unique("kept"), Partitions: 5, Retention: 36 * time.Hour}
		grown := existing
		grown.Partitions = 4 // asked again with more: left as it is
		for range 2 {        // the second call finds all three
			if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, compacted, grown, kept); err != nil {
				t.Fatal(err)
			}
		}
		adm := kadm.NewClient(cl)
		td, err := adm.ListTopics(ctx, compacted.Name, existing.Name, kept.Name)
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]int{compacted.Name: 3, existing.Name: 2, kept.Name: 5} {
			if got := len(td[name].Partitions); got != want {
				t.Fatalf("%s: %d partitions, want %d", name, got, want)
			}
		}
		rc, err := adm.DescribeTopicConfigs(ctx, compacted.Name, kept.Name)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]map[string]string{
			compacted.Name: {"cleanup.policy": "compact"},
			kept.Name:      {"cleanup.policy": "delete", "retention.ms": "129600000"},
		}
		for _, r := range rc {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			got := map[string]string{}
			for _, c := range r.Configs {
				if c.Value != nil {
					got[c.Key] = *c.Value
				}
			}
			for k, v := range want[r.Name] {
				if got[k] != v {
					t.Fatalf("%s: %s=%q, want %q", r.Name, k, got[k], v)
				}
			}
		}
	})
}
