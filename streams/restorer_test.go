package streams_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/streamstest"
)

// TestRebuildWaitsForOpenTransactions: a partition's previous owner may
// still have a transaction open on the changelog when the new owner
// rebuilds. That transaction commits the inputs' offsets with it, so the
// new owner never processes those inputs again: a rebuild that stopped at
// the stable offset as it stood would lack that batch for good (a ledger
// missing bookings, or a withdrawal). The rebuild waits for it to end.
func TestRebuildWaitsForOpenTransactions(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ctx := context.Background()
		topic := streamstest.Unique("changelog")
		streamstest.CreateTopics(t, b.Kafka, 1, topic)
		cl := streamstest.Client(t, b.Kafka)
		streamstest.ProduceSync(t, cl, &kgo.Record{Topic: topic, Value: []byte("committed")})
		txn, err := b.Kafka.NewClient(kgo.TransactionalID(streamstest.Unique("previous-owner")))
		if err != nil {
			t.Fatal(err)
		}
		defer txn.Close()
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("in flight %d", i))}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		var got []string
		r := streams.NewRestorer(b.Kafka, func(map[int32]bool) error { return nil }, func(rec *kgo.Record) error {
			mu.Lock()
			got = append(got, string(rec.Value))
			mu.Unlock()
			return nil
		}, topic)
		done := make(chan error, 1)
		go func() { done <- r.Rebuild(ctx, 0) }()
		select {
		case err := <-done:
			t.Fatalf("the rebuild ended (%v) while a transaction was open on the partition, with %d records", err, len(got))
		case <-time.After(time.Second):
		}
		if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 4 {
			t.Fatalf("rebuilt from %v; want the committed record and the transaction's three", got)
		}
	})
}
