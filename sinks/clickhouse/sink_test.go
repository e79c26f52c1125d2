package clickhouse_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/sinks/clickhouse/chdbhttp"
	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

// One chDB session per process (a chDB limit), shared by the tests; the
// server driver reaches the same database over HTTP (chdbhttp).
var (
	store  *clickhouse.ChDB
	server *clickhouse.Server
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		// Fuzzing the sinks' readers needs no store, and each fuzz worker
		// is a process of its own: chDB is not opened for them.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "surge-chdb-")
	if err != nil {
		panic(err)
	}
	store, err = clickhouse.OpenChDB(dir, clickhouse.ChDBConnections(3))
	if err != nil {
		panic(err)
	}
	endpoint, err := chdbhttp.Listen(store, "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	if server, err = clickhouse.OpenServer(context.Background(), endpoint.DSN()); err != nil {
		panic(err)
	}
	code := m.Run()
	_ = server.Close()
	_ = endpoint.Close()
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
	for name, st := range drivers() { // either driver reads what is applied
		again, err := clickhouse.Migrate(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		if len(again) != 0 {
			t.Fatalf("second migrate through the %s driver applied %v", name, again)
		}
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

func (f *flaky) Insert(ctx context.Context, table string, cols []clickhouse.Column, w *clickhouse.RowWriter) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("connection refused")
	}
	return f.Store.Insert(ctx, table, cols, w)
}

// Every presence change lands in the table exactly once, although the
// first writes fail, three tasks insert at once and the whole topic is
// delivered a second time; on both drivers.
func TestSinkLosesNoRowAndRedeliveryDoesNotDouble(t *testing.T) {
	// In turn: the backends share one ClickHouse table set.
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		for _, name := range []string{"chdb", "server"} {
			t.Run(name, func(t *testing.T) { sinkLosesNoRow(t, b, drivers()[name]) })
		}
	}, streamstest.InTurn)
}

func sinkLosesNoRow(t *testing.T, b streamstest.Backend, store clickhouse.Store) {
	ctx := context.Background()
	if _, err := clickhouse.Migrate(ctx, store); err != nil {
		t.Fatal(err)
	}
	if err := store.Exec(ctx, "TRUNCATE TABLE presence_changes"); err != nil {
		t.Fatal(err)
	}
	topic := streamstest.Unique("presence")
	streamstest.CreateTopics(t, b.Kafka, 3, topic)
	cl := streamstest.Client(t, b.Kafka)
	const n = 5000
	var recs []*kgo.Record
	for u := 0; u < n; u++ {
		r, _ := streams.NewRecord(topic, nil, &surgev1.LoginEvent{Uin: uint64(u), Online: u%3 != 0, AtMs: int64(1000 + u)})
		recs = append(recs, r)
	}
	streamstest.ProduceSync(t, cl, recs...)

	reg := metrics.NewRegistry()
	run := func(group string, st clickhouse.Store, tasks int) {
		s := clickhouse.Presence().Bind(st)
		s.Topic = topic
		s.Registry = reg
		var in atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() {
			done <- s.RunTasks(ctx, b.Kafka, tasks, streams.Group(group), streams.Metrics(metrics.NewRegistry()),
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
	run(streamstest.Unique("g1"), f, 3)     // three tasks, inserting at once
	run(streamstest.Unique("g2"), store, 1) // a second group: every row delivered again

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
	// Each group inserted every row once; the three failed inserts
	// are counted apart.
	var text strings.Builder
	_ = reg.WriteText(&text)
	for _, want := range []string{
		`surge_sink_rows_total{sink="sink-presence"} 10000`,
		`surge_sink_inserts_total{outcome="failed",sink="sink-presence"} 3`,
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, text.String())
		}
	}
	raw, _ := store.QueryStrings(ctx, "SELECT count() FROM presence_changes")
	t.Logf("%s raw rows before merge for %d records delivered twice", raw[0][0], n)
}

// Every sink's columns exist in its table after migration, with a type
// its RowBinary encoding fits: a sink and a table can not drift apart
// unnoticed.
func TestSinkColumnsMatchTables(t *testing.T) {
	ctx := context.Background()
	if _, err := clickhouse.Migrate(ctx, store); err != nil {
		t.Fatal(err)
	}
	if err := clickhouse.CheckTables(ctx, store, clickhouse.Facts()...); err != nil {
		t.Fatal(err)
	}
}

// What a migration cannot mend is told before a sink starts: a table
// dropped by hand after its migration was recorded, a column missing or
// altered to a type the sink's encoding does not fit.
func TestCheckTablesNamesWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	for _, ddl := range []string{
		"DROP TABLE IF EXISTS check_altered",
		"CREATE TABLE check_altered (uin UInt64, at_ms Int64) ENGINE = MergeTree ORDER BY uin",
	} {
		if err := store.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
	}
	missing, altered := clickhouse.Presence(), clickhouse.Presence()
	missing.Table, altered.Table = "check_dropped", "check_altered"
	err := clickhouse.CheckTables(ctx, server, missing, altered)
	if err == nil {
		t.Fatal("no error for a missing table and an altered one")
	}
	for _, want := range []string{
		"table check_dropped is missing",
		"column check_altered.uin is UInt64; the sink writes [UInt32]",
		"table check_altered has no column online",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// A dead letter lands with its source position, reason and time (the
// Int32, UInt32 and DateTime64 paths of RowBinary).
func TestDeadLetterRow(t *testing.T) {
	ctx := context.Background()
	if _, err := clickhouse.Migrate(ctx, store); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 10, 0, 0, 250e6, time.UTC)
	rec := &kgo.Record{Topic: "platform.dead-letter", Key: []byte{0xab}, Value: []byte("xyz"), Timestamp: at, Headers: []kgo.RecordHeader{
		{Key: streams.HeaderDLQTopic, Value: []byte("wallet.grants")}, {Key: streams.HeaderDLQPartition, Value: []byte("7")},
		{Key: streams.HeaderDLQOffset, Value: []byte("123456789012")}, {Key: streams.HeaderDLQProcessor, Value: []byte("grant")},
		{Key: streams.HeaderDLQReason, Value: []byte("malformed order number: 'x'")},
	}}
	s := clickhouse.DeadLetters().Bind(store)
	if err := s.Handle()(ctx, rec, nil); err != nil {
		t.Fatal(err)
	}
	bad := &kgo.Record{Topic: "platform.dead-letter", Value: []byte("x")} // no source position
	if err := s.Handle()(ctx, bad, nil); !streams.IsReject(err) {
		t.Fatalf("dead letter without a position: %v", err)
	}
	if err := s.FlushForBench(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := store.QueryStrings(ctx, "SELECT source_topic, source_partition, source_offset, processor, reason, key_hex, value_bytes, toUnixTimestamp64Milli(at) FROM dead_letters FINAL WHERE source_offset = 123456789012")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"wallet.grants", "7", "123456789012", "grant", "malformed order number: 'x'", "ab", "3", strconv.FormatInt(at.UnixMilli(), 10)}
	if len(rows) != 1 || !slices.Equal(rows[0], want) {
		t.Fatalf("dead_letters: %v, want %v", rows, want)
	}
}

// The connections of the pool run queries at once: while one runs a slow
// query, another sees it in system.processes. Rows inserted from many
// goroutines at once all land.
func TestChDBRunsQueriesAtOnce(t *testing.T) {
	ctx := context.Background()
	if store.Connections() < 2 {
		t.Skipf("pool of %d connections", store.Connections())
	}
	slow := make(chan error, 1)
	go func() { slow <- store.Exec(ctx, "SELECT sleep(2) AS surge_slow_probe") }()
	seen := false
	for !seen {
		rows, err := store.QueryStrings(ctx, "SELECT count() FROM system.processes WHERE query LIKE '%sleep(2) AS surge_slow_probe%' AND query NOT LIKE '%system.processes%'")
		if err != nil {
			t.Fatal(err)
		}
		seen = rows[0][0] != "0"
		select {
		case err := <-slow:
			if !seen {
				t.Fatalf("the slow query ended (%v) and no other query ran while it did", err)
			}
			slow <- err
		default:
		}
	}
	if err := <-slow; err != nil {
		t.Fatal(err)
	}

	if _, err := clickhouse.Migrate(ctx, store); err != nil {
		t.Fatal(err)
	}
	if err := store.Exec(ctx, "TRUNCATE TABLE presence_changes"); err != nil {
		t.Fatal(err)
	}
	const writers, inserts, rows = 4, 5, 2000
	errs := make(chan error, writers)
	for g := range writers {
		go func() {
			cols := clickhouse.Columns("uin UInt32, online UInt8, at_ms Int64")
			w := clickhouse.NewRowWriter(cols)
			for i := range inserts {
				w.Reset()
				for r := range rows {
					w.U32(uint32((g*inserts+i)*rows + r))
					w.Bool(true)
					w.I64(1)
					w.EndRow()
				}
				if err := store.Insert(ctx, "presence_changes", cols, w); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	got, err := store.QueryStrings(ctx, "SELECT count(), uniqExact(uin) FROM presence_changes")
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.Itoa(writers * inserts * rows)
	if got[0][0] != want || got[0][1] != want {
		t.Fatalf("count, distinct = %v, want %s", got[0], want)
	}
}

// Tasks that cannot start end RunTasks with their error; it does not wait
// for a context that nobody cancels.
func TestRunTasksReturnsWhenTasksFail(t *testing.T) {
	s := clickhouse.Presence().Bind(store)
	done := make(chan error, 1)
	go func() { done <- s.RunTasks(context.Background(), streams.Seeds("127.0.0.1:1"), 3, streams.MaxBatch(0)) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "max batch") {
			t.Fatalf("RunTasks: %v, want the tasks' configuration error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("RunTasks did not return although every task failed")
	}
	if err := clickhouse.Presence().RunTasks(context.Background(), streams.Cluster{}, 2); err == nil {
		t.Fatal("a sink with no store ran")
	}
}

// TestCashGrantsJoinTheOtherGrants: a cash grant is published inside its
// token on wallet.tokens, any other grant on wallet.grants; sink-grants and
// sink-cash-grants fill the one grants table with both, every grant once,
// and a token of an earlier build (its grant on wallet.grants) adds no row.
func TestCashGrantsJoinTheOtherGrants(t *testing.T) {
	// In turn: the backends share one ClickHouse table set.
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ctx := context.Background()
		if _, err := clickhouse.Migrate(ctx, store); err != nil {
			t.Fatal(err)
		}
		if err := store.Exec(ctx, "TRUNCATE TABLE grants"); err != nil {
			t.Fatal(err)
		}
		grantsTopic, tokensTopic := streamstest.Unique("grants"), streamstest.Unique("tokens")
		streamstest.CreateTopics(t, b.Kafka, 3, grantsTopic, tokensTopic)
		cl := streamstest.Client(t, b.Kafka)
		const cash, others, old = 300, 100, 20
		var recs []*kgo.Record
		var sum int64
		for i := range cash + others + old {
			g := &surgev1.RewardGrant{OrderNo: fmt.Sprintf("u%d_rain_r%d_1_1", i%50, i), ActId: fmt.Sprintf("u%d", i%50), ActivityId: "spring-live",
				SceneId: "rain", AwardType: surgev1.AwardType_CASH, Amount: int64(1 + i), AtMs: 1000}
			var r *kgo.Record
			switch {
			case i < cash: // this build: the grant rides in its token
				r, _ = streams.NewRecord(tokensTopic, []byte(g.ActId), &surgev1.Token{OutTradeNo: g.OrderNo, ActId: g.ActId, Amount: g.Amount, Grant: g})
			case i < cash+others:
				g.AwardType, g.SceneId = surgev1.AwardType_COUPON, "coupon"
				r, _ = streams.NewRecord(grantsTopic, []byte(g.ActId), g)
			default: // an earlier build's token, its grant published apart
				r, _ = streams.NewRecord(tokensTopic, []byte(g.ActId), &surgev1.Token{OutTradeNo: g.OrderNo, ActId: g.ActId, Amount: g.Amount})
				gr, _ := streams.NewRecord(grantsTopic, []byte(g.ActId), g)
				recs = append(recs, gr)
			}
			recs = append(recs, r)
			sum += g.Amount
		}
		streamstest.ProduceSync(t, cl, recs...)
		run := func(s *clickhouse.Sink, topic string, want int) {
			s.Topic = topic
			s.Bind(store)
			var in atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() {
				done <- s.Run(ctx, b.Kafka, streams.Group(streamstest.Unique("g")), streams.Metrics(metrics.NewRegistry()),
					streams.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))), streams.OnCommit(func(i, _ int) { in.Add(int64(i)) }))
			}()
			for deadline := time.Now().Add(60 * time.Second); in.Load() < int64(want) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if in.Load() != int64(want) {
				t.Fatalf("%s committed %d records of %d", s.Name, in.Load(), want)
			}
		}
		run(clickhouse.Grants(), grantsTopic, others+old)
		run(clickhouse.CashGrants(), tokensTopic, cash+old)
		rows, err := store.QueryStrings(ctx, "SELECT count(), uniqExact(order_no), countIf(award_type = 'CASH'), sum(amount) FROM grants FINAL")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{strconv.Itoa(cash + others + old), strconv.Itoa(cash + others + old), strconv.Itoa(cash + old), strconv.FormatInt(sum, 10)}
		if !slices.Equal(rows[0], want) {
			t.Fatalf("grants table: rows, orders, cash, amount = %v, want %v", rows[0], want)
		}
	}, streamstest.InTurn)
}
