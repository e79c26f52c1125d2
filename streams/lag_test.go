package streams_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

// surge_consumer_lag has a series for every partition the instance holds,
// also for those that never had a record (read from the group's lag, not
// only from fetches that returned records).
func TestLagReportedForPartitionsWithoutRecords(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		topic := streamstest.Unique("lag")
		streamstest.CreateTopics(t, b.Kafka, 3, topic)
		cl := streamstest.Client(t, b.Kafka)
		var recs []*kgo.Record
		for range 5 {
			recs = append(recs, loginRecord(t, topic, 7)) // one key: one partition
		}
		streamstest.ProduceSync(t, cl, recs...)
		reg := metrics.NewRegistry()
		name := streamstest.Unique("lagger")
		r, err := streams.New(name, func(context.Context, *kgo.Record, *streams.Output) error { return nil },
			streams.Kafka(b.Kafka), streams.Group(name), streams.Inputs(topic), streams.Metrics(reg), streams.LagEvery(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		runInBackground(t, r)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var text bytes.Buffer
			if err := reg.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			n := 0
			for p := range 3 {
				if strings.Contains(text.String(), fmt.Sprintf(`surge_consumer_lag{partition="%d",processor="%s",topic="%s"} 0`, p, name, topic)) {
					n++
				}
			}
			if n == 3 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("lag series for %d of 3 partitions:\n%s", n, grepLines(text.String(), "surge_consumer_lag"))
			}
		}
	})
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
