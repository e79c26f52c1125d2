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

// TestReplayWaitsForTheLastTransaction: a transactional topic whose last
// committed transaction's marker sits just before a newer transaction's
// record, not yet committed when the replay lists the end: the replay
// reads on until that record, not stopping at the marker (a restore that
// did missed the planner's last transition).
func TestReplayWaitsForTheLastTransaction(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		topic := streamstest.Unique("transitions")
		streamstest.CreateTopics(t, b.Kafka, 1, topic)
		txn := streamstest.Client(t, b.Kafka, kgo.TransactionalID(streamstest.Unique("writer")))
		write := func(v string, commit bool) {
			t.Helper()
			if err := txn.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			if commit {
				if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
					t.Fatal(err)
				}
			}
		}
		write("first", true)
		write("second", false) // open while the replay lists the end
		go func() {
			time.Sleep(500 * time.Millisecond)
			_ = txn.EndTransaction(ctx, kgo.TryCommit)
		}()
		var got []string
		err := streams.Replay(ctx, b.Kafka, topic, streams.ReplayFrom{Transactional: true}, func(r *kgo.Record) error {
			got = append(got, string(r.Value))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[1] != "second" {
			t.Fatalf("replay read %q, want [first second]", got)
		}
	})
}
