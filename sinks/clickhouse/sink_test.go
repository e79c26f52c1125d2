package clickhouse_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

// One chDB session per process (a chDB limit), shared by the tests.
var store *clickhouse.ChDB

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "surge-chdb-")
	if err != nil {
		panic(err)
	}
	store, err = clickhouse.OpenChDB(dir)
	if err != nil {
		panic(err)
	}
	code := m.Run()
	_ = store.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestMigrationsApplyOnceAndAreRecorded(t *testing.T) {
	ctx := context.Background()
	first, err := clickhouse.Migrate(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	again, err := clickhouse.Migrate(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 0 {
		t.Fatalf("second migrate applied %v", again)
	}
	rows, err := store.QueryStrings(ctx, "SELECT count() FROM schema_migrations")
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] == "0" || len(first) > 0 && rows[0][0] != strconv.Itoa(len(first)) {
		t.Fatalf("schema_migrations has %s rows after applying %v", rows[0][0], first)
	}
}

// flaky fails the first inserts, like a server that went away.
type flaky struct {
	clickhouse.Store
	fails atomic.Int32
}

func (f *flaky) Exec(ctx context.Context, sql string) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("connection refused")
	}
	return f.Store.Exec(ctx, sql)
}

// Every presence change lands in the table exactly once, although the
// first writes fail and the whole topic is delivered a second time.
func TestSinkLosesNoRowAndRedeliveryDoesNotDouble(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ctx := context.Background()
		if _, err := clickhouse.Migrate(ctx, store); err != nil {
			t.Fatal(err)
		}
		if err := store.Exec(ctx, "TRUNCATE TABLE presence_changes"); err != nil {
			t.Fatal(err)
		}
		topic := streamstest.Unique("presence")
		streamstest.CreateTopics(t, b.Brokers, 3, topic)
		cl := streamstest.Client(t, b.Brokers)
		const n = 5000
		var recs []*kgo.Record
		for u := 0; u < n; u++ {
			r, _ := streams.NewRecord(topic, nil, &surgev1.LoginEvent{Uin: uint64(u), Online: u%3 != 0, AtMs: int64(1000 + u)})
			recs = append(recs, r)
		}
		streamstest.ProduceSync(t, cl, recs...)

		run := func(group string, st clickhouse.Store) {
			s := clickhouse.Presence().Bind(st)
			s.Topic = topic
			var in atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() {
				done <- s.Run(ctx, b.Brokers, streams.Group(group), streams.Metrics(metrics.NewRegistry()),
					streams.Backoff(5*time.Millisecond, 20*time.Millisecond), streams.MaxBatch(1000),
					streams.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))),
					streams.OnCommit(func(i, _ int) { in.Add(int64(i)) }))
			}()
			deadline := time.Now().Add(60 * time.Second)
			for in.Load() < n && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			<-done
			if in.Load() != n {
				t.Fatalf("committed %d of %d", in.Load(), n)
			}
		}
		f := &flaky{Store: store}
		f.fails.Store(3)
		run(streamstest.Unique("g1"), f)
		run(streamstest.Unique("g2"), store) // a second group: every row delivered again

		rows, err := store.QueryStrings(ctx, "SELECT count(), uniqExact(uin), sum(online) FROM presence_changes FINAL")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"5000", "5000", "3333"}
		for i := range want {
			if rows[0][i] != want[i] {
				t.Fatalf("table has count, distinct, online = %v, want %v", rows[0], want)
			}
		}
		raw, _ := store.QueryStrings(ctx, "SELECT count() FROM presence_changes")
		t.Logf("%s raw rows before merge for %d records delivered twice", raw[0][0], n)
	})
}
