package streams_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/streamstest"
)

// PartitionFor must agree with the partition the default producer picks,
// or batches written by it land away from their keys' partition.
func TestPartitionForMatchesProducer(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		topic := streamstest.Unique("part")
		streamstest.CreateTopics(t, b.Kafka, 12, topic)
		cl := streamstest.Client(t, b.Kafka)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var recs []*kgo.Record
		for i := range 500 {
			key := binary.BigEndian.AppendUint32(nil, uint32(i*7919))
			if i%5 == 0 {
				key = []byte(fmt.Sprintf("job-%d", i)) // lengths not a multiple of 4
			}
			recs = append(recs, &kgo.Record{Topic: topic, Key: key, Value: []byte{1}})
		}
		res := cl.ProduceSync(ctx, recs...)
		if err := res.FirstErr(); err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if want := streams.PartitionFor(r.Record.Key, 12); int(r.Record.Partition) != want {
				t.Fatalf("key %x went to %d, PartitionFor says %d", r.Record.Key, r.Record.Partition, want)
			}
		}
	})
}
