package numpkg_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kadm"

	"surge/processors/push/numpkg"
	"surge/streams/streamstest"
)

// A restarted store goes on from its saved position: a package published
// before the restart is still read after the topic's records before that
// position were deleted (a store rebuilt from the topic would have lost
// it), and one published while it was down arrives.
func TestTopicStoreResumesFromItsPosition(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		topic := streamstest.Unique("packages")
		// One partition: "before" and "while-down" share it, so deleting
		// the records before the last one deletes "before" from the topic.
		streamstest.CreateTopics(t, b.Kafka, 1, topic)
		dir := filepath.Join(t.TempDir(), "packages")
		before := roaring.BitmapOf(1, 2, 3)

		open := func() (*numpkg.TopicStore, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			s, err := numpkg.OpenTopicStore(ctx, b.Kafka, topic, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, cancel
		}
		s, stop := open()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s.Put(ctx, "before", before); err != nil {
			t.Fatal(err)
		}
		// Wait until the store consumed its own chunks and saved the
		// position after them (CheckpointEvery).
		time.Sleep(numpkg.CheckpointEvery + 2*time.Second)
		stop()
		time.Sleep(300 * time.Millisecond) // the table's goroutine ends
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}

		// Publish one while it is down, then delete everything before it.
		cl := streamstest.Client(t, b.Kafka)
		data, err := numpkg.Encode(roaring.BitmapOf(7, 8))
		if err != nil {
			t.Fatal(err)
		}
		streamstest.ProduceSync(t, cl, numpkg.Chunks(topic, "while-down", data)...)
		adm := kadm.NewClient(cl)
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		del := kadm.Offsets{}
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset > 0 {
				del.AddOffset(topic, o.Partition, o.Offset-1, -1)
			}
		})
		if _, err := adm.DeleteRecords(ctx, del); err != nil {
			t.Fatal(err)
		}

		s, stop = open()
		defer func() { stop(); time.Sleep(300 * time.Millisecond); _ = s.Close() }()
		got, err := s.Get(ctx, s.URI("before"))
		if err != nil {
			t.Fatalf("package published before the restart: %v (the store was rebuilt instead of resumed)", err)
		}
		if !got.Equals(before) {
			t.Fatalf("package before the restart: got %v, want %v", got.ToArray(), before.ToArray())
		}
		got, err = s.Get(ctx, s.URI("while-down"))
		if err != nil || got.GetCardinality() != 2 {
			t.Fatalf("package published while down: %v, %v", got, err)
		}
	})
}

// A store whose topic was recreated behind it (its position past the new
// end) is rebuilt, not read on from a position that no longer exists.
func TestTopicStoreRebuildsWhenTopicRecreated(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		topic := streamstest.Unique("packages")
		streamstest.CreateTopics(t, b.Kafka, 1, topic)
		dir := filepath.Join(t.TempDir(), "packages")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()

		sctx, stop := context.WithCancel(ctx)
		s, err := numpkg.OpenTopicStore(sctx, b.Kafka, topic, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"a", "b", "c"} {
			if _, err := s.Put(ctx, id, roaring.BitmapOf(1)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(numpkg.CheckpointEvery + 2*time.Second)
		stop()
		time.Sleep(300 * time.Millisecond)
		_ = s.Close()

		cl := streamstest.Client(t, b.Kafka)
		adm := kadm.NewClient(cl)
		if _, err := adm.DeleteTopics(ctx, topic); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("recreate %s: %v", topic, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
		// The broker answers for the new topic only once its metadata has
		// caught up with the controller: until then a listing may still
		// show the old log's end (it did once, on the real broker). The
		// store is opened by a service later than that in practice.
		for {
			ends, err := adm.ListEndOffsets(ctx, topic)
			if o, ok := ends.Lookup(topic, 0); err == nil && ok && o.Err == nil && o.Offset == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the recreated %s never showed as empty: %v", topic, err)
			}
			time.Sleep(100 * time.Millisecond)
		}

		sctx, stop = context.WithCancel(ctx)
		defer stop()
		s, err = numpkg.OpenTopicStore(sctx, b.Kafka, topic, dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { stop(); time.Sleep(300 * time.Millisecond); _ = s.Close() }()
		if _, err := s.Get(ctx, s.URI("a")); !errors.Is(err, numpkg.ErrNotFound) {
			t.Fatalf("package of the deleted topic: err %v, want ErrNotFound (the stale store was kept)", err)
		}
	})
}
