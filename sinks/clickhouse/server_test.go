package clickhouse_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/sinks/clickhouse/chdbhttp"
	"surge/streams"
	"surge/streams/embedded"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

// drivers are the two ways to reach ClickHouse, both on the one chDB
// database of this test process: chDB in-process, and clickhouse-go v2
// (the server driver) over HTTP through chdbhttp.
func drivers() map[string]clickhouse.Store {
	return map[string]clickhouse.Store{"chdb": store, "server": server}
}

// sampleRows writes n rows of cols with values that reach the edges of
// each type: empty and non-ASCII strings, negative and extreme integers,
// times before and after the epoch.
func sampleRows(cols []clickhouse.Column, n int) *clickhouse.RowWriter {
	w := clickhouse.NewRowWriter(cols)
	for r := range n {
		for i, c := range cols {
			k := r*len(cols) + i
			switch c.Type {
			case clickhouse.String:
				w.Str([]string{"", "a", "grant_7_rain_1", "红包 ünïcode", "quote ' and \\ and \n", strings.Repeat("x", 300)}[k%6] + fmt.Sprint(r))
			case clickhouse.Int32:
				w.I32([]int32{0, -1, math.MinInt32, math.MaxInt32, int32(k)}[k%5])
			case clickhouse.Int64:
				w.I64([]int64{0, -1, math.MinInt64, math.MaxInt64, int64(k) * 1e12}[k%5])
			case clickhouse.UInt8:
				w.U8([]uint8{0, 1, 255, uint8(k)}[k%4])
			case clickhouse.UInt32:
				w.U32([]uint32{0, 1, math.MaxUint32, uint32(k) * 7919}[k%4])
			case clickhouse.UInt64:
				w.U64([]uint64{0, 1, math.MaxUint64, uint64(k) << 40}[k%4])
			case clickhouse.DateTime64ms:
				w.Millis([]int64{0, 1, 1_764_806_400_123, -86_400_000, int64(k) * 3_600_000}[k%5])
			}
		}
		w.EndRow()
	}
	return w
}

// The server driver writes into every sink's table exactly what the
// embedded driver writes: the same rows, value for value. Each driver
// inserts the same rows into its own copy of the table, and the copies
// are compared as text.
func TestServerDriverWritesWhatTheEmbeddedDriverWrites(t *testing.T) {
	ctx := context.Background()
	if _, err := clickhouse.Migrate(ctx, store); err != nil {
		t.Fatal(err)
	}
	for _, s := range clickhouse.Facts() {
		t.Run(s.Name, func(t *testing.T) {
			const n = 40
			var got []string
			for _, name := range []string{"chdb", "server"} {
				st := drivers()[name]
				copyName := "drivers_" + name + "_" + s.Table
				for _, ddl := range []string{
					"DROP TABLE IF EXISTS " + copyName,
					"CREATE TABLE " + copyName + " AS " + s.Table + " ENGINE = MergeTree ORDER BY tuple()",
				} {
					if err := st.Exec(ctx, ddl); err != nil {
						t.Fatal(err)
					}
				}
				if err := st.Insert(ctx, copyName, s.Columns, sampleRows(s.Columns, n)); err != nil {
					t.Fatalf("%s driver: %v", name, err)
				}
				cols := make([]string, len(s.Columns))
				for i, c := range s.Columns {
					cols[i] = "toString(" + c.Name + ")"
				}
				rows, err := st.QueryStrings(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+copyName)
				if err != nil {
					t.Fatalf("%s driver: %v", name, err)
				}
				if len(rows) != n {
					t.Fatalf("%s driver: %d rows in %s, want %d", name, len(rows), copyName, n)
				}
				text := make([]string, len(rows))
				for i, r := range rows {
					text[i] = strings.Join(r, "\t")
				}
				slices.Sort(text)
				got = append(got, strings.Join(text, "\n"))
				if err := st.Exec(ctx, "DROP TABLE "+copyName); err != nil {
					t.Fatal(err)
				}
			}
			if got[0] != got[1] {
				t.Fatalf("the drivers wrote different rows into %s:\nchdb:\n%s\nserver:\n%s", s.Table, got[0], got[1])
			}
		})
	}
}

// A statement the engine refuses comes back through the server driver as
// the engine's error.
func TestServerDriverReportsEngineErrors(t *testing.T) {
	ctx := context.Background()
	err := server.Exec(ctx, "SELECT * FROM no_such_table_here")
	if err == nil || !strings.Contains(err.Error(), "no_such_table_here") {
		t.Fatalf("a query of a missing table gave %v", err)
	}
	cols := clickhouse.Columns("uin UInt32, online UInt8, at_ms Int64")
	if err := server.Insert(ctx, "no_such_table_here", cols, sampleRows(cols, 1)); err == nil {
		t.Fatal("an insert into a missing table succeeded")
	}
}

// dropping takes the endpoint down just before the second insert, and
// brings it back on the same address a little later: a server that went
// away for a moment, with the driver's connections really cut.
type dropping struct {
	clickhouse.Store
	inserts atomic.Int32
	drop    func()
}

func (d *dropping) Insert(ctx context.Context, table string, cols []clickhouse.Column, w *clickhouse.RowWriter) error {
	if d.inserts.Add(1) == 2 {
		d.drop()
	}
	return d.Store.Insert(ctx, table, cols, w)
}

// A sink on the server driver whose server goes away mid-run retries until
// it is back, and every row lands once.
func TestServerSinkRidesOutALostConnection(t *testing.T) {
	ctx := context.Background()
	if _, err := clickhouse.Migrate(ctx, store); err != nil {
		t.Fatal(err)
	}
	if err := store.Exec(ctx, "TRUNCATE TABLE presence_changes"); err != nil {
		t.Fatal(err)
	}
	ep, err := chdbhttp.Listen(store, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(ep.DSN(), "http://"), "/default")
	srv, err := clickhouse.OpenServer(ctx, ep.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	back := make(chan *chdbhttp.Endpoint, 1)
	d := &dropping{Store: srv, drop: func() {
		_ = ep.Close()
		go func() {
			time.Sleep(300 * time.Millisecond)
			again, err := chdbhttp.Listen(store, addr)
			if err != nil {
				t.Error(err)
			}
			back <- again
		}()
	}}

	k, err := embedded.StartKafka() // the broker is not what this test is about
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	b := streamstest.Backend{Name: "kfake", Kafka: streams.Seeds(k.Brokers()...)}
	topic := streamstest.Unique("presence")
	streamstest.CreateTopics(t, b.Kafka, 1, topic)
	const n = 5000
	var recs []*kgo.Record
	for u := range n {
		r, _ := streams.NewRecord(topic, nil, &surgev1.LoginEvent{Uin: uint64(u), Online: true, AtMs: 1})
		recs = append(recs, r)
	}
	streamstest.ProduceSync(t, streamstest.Client(t, b.Kafka), recs...)

	reg := metrics.NewRegistry()
	s := clickhouse.Presence().Bind(d)
	s.Topic, s.Registry = topic, reg
	var in atomic.Int64
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- s.RunTasks(runCtx, b.Kafka, 1, streams.Group(streamstest.Unique("g")), streams.Metrics(metrics.NewRegistry()),
			streams.Backoff(10*time.Millisecond, 50*time.Millisecond), streams.MaxBatch(1000),
			streams.Logger(slog.New(slog.NewTextHandler(io.Discard, nil))),
			streams.OnCommit(func(i, _ int) { in.Add(int64(i)) }))
	}()
	for deadline := time.Now().Add(60 * time.Second); in.Load() < n && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
	defer func() { (<-back).Close() }()
	if in.Load() != n {
		t.Fatalf("committed %d of %d", in.Load(), n)
	}
	rows, err := store.QueryStrings(ctx, "SELECT count(), uniqExact(uin) FROM presence_changes FINAL")
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] != "5000" || rows[0][1] != "5000" {
		t.Fatalf("count, distinct = %v, want 5000 each", rows[0])
	}
	var text strings.Builder
	_ = reg.WriteText(&text)
	if !regexp.MustCompile(`surge_sink_inserts_total\{outcome="failed",sink="sink-presence"\} [1-9]`).MatchString(text.String()) {
		t.Fatalf("no failed insert counted while the server was away:\n%s", text.String())
	}
	t.Logf("%d inserts tried, the second with the server away", d.inserts.Load())
}
