package clickhouse

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// Sink batches a topic's records into one table. Rows are inserted before
// the batch's offsets commit (streams.BeforeCommit) and the tables are
// ReplacingMergeTree keyed by each record's identity, so a redelivered
// batch replaces rows rather than doubling them: at-least-once delivery,
// exactly-once rows after merges (and with FINAL in queries).
type Sink struct {
	Name    string
	Topic   string
	Table   string
	Columns []Column
	// Write appends the record's rows (usually one; a delivery report
	// expands to a row per uin) to w, or rejects the record.
	Write func(r *kgo.Record, w *RowWriter) error
	// Message and Fields, for a table whose columns are the record's
	// fields: its message type, and the fields in column order (Write is
	// then FieldRows).
	Message proto.Message
	Fields  []string
	// Registry receives the sink's insert metrics (default metrics.Default).
	Registry *metrics.Registry

	store Store
	rows  *RowWriter
	m     *sinkMetrics
}

// sinkMetrics tell an operator how fast each sink inserts and how much of
// its time the inserts take (rate of seconds over rate of rows).
type sinkMetrics struct {
	rows, inserts, failed metrics.Counter
	took                  metrics.Histogram
}

func (s *Sink) metrics() *sinkMetrics {
	if s.m == nil {
		reg := s.Registry
		if reg == nil {
			reg = metrics.Default
		}
		s.m = &sinkMetrics{
			rows:    reg.NewCounterVec("surge_sink_rows_total", "rows inserted into ClickHouse", "sink").With(s.Name),
			inserts: reg.NewCounterVec("surge_sink_inserts_total", "inserts by outcome", "sink", "outcome").With(s.Name, "ok"),
			failed:  reg.NewCounterVec("surge_sink_inserts_total", "inserts by outcome", "sink", "outcome").With(s.Name, "failed"),
			took: reg.NewHistogramVec("surge_sink_insert_duration_seconds", "inserts into ClickHouse, failed ones included",
				metrics.LatencyBuckets, "sink").With(s.Name),
		}
	}
	return s.m
}

// fieldSink is a sink whose rows are the fields of msg: columns names the
// columns and their types, fields the message fields behind them.
func fieldSink(name, topic, table string, msg proto.Message, columns string, fields ...string) *Sink {
	cols := Columns(columns)
	return &Sink{Name: name, Topic: topic, Table: table, Columns: cols, Message: msg, Fields: fields, Write: FieldRows(msg, cols, fields...)}
}

// Bind attaches a store.
func (s *Sink) Bind(st Store) *Sink { s.store = st; return s }

func (s *Sink) writer() *RowWriter {
	if s.rows == nil {
		s.rows = NewRowWriter(s.Columns)
	}
	return s.rows
}

// Handle is the streams handler: it only buffers.
func (s *Sink) Handle() streams.Handler {
	return func(_ context.Context, in *kgo.Record, _ *streams.Output) error {
		w := s.writer()
		m := w.mark()
		if err := s.Write(in, w); err != nil {
			w.undo(m)
			return err
		}
		if err := w.Err(); err != nil {
			panic(fmt.Sprintf("sink %s: %v", s.Name, err)) // a Write that disagrees with Columns is a bug
		}
		return nil
	}
}

// flush inserts the batch's rows in one insert, before the commit.
func (s *Sink) flush(ctx context.Context) error {
	w, m := s.writer(), s.metrics()
	if w.Rows() == 0 {
		return nil
	}
	start := time.Now()
	err := s.store.Insert(ctx, s.Table, s.Columns, w)
	m.took.Since(start)
	if err != nil {
		m.failed.Inc()
		return err
	}
	m.inserts.Inc()
	m.rows.Add(float64(w.Rows()))
	return nil
}

// Spec is the sink's topology: one topic into one table, at least once
// (the tables dedupe or the checks tolerate repeats).
func (s *Sink) Spec() streams.Spec {
	return streams.Spec{Name: s.Name, Group: s.Name, Guarantee: streams.AtLeastOnce,
		Inputs: []string{s.Topic}, Stores: []string{"clickhouse: " + s.Table},
		Doc: "writes " + s.Topic + " into the " + s.Table + " table"}
}

// Options are the runtime options a sink needs.
func (s *Sink) Options() []streams.Option {
	return []streams.Option{
		streams.Declare(s.Spec(), ""),
		streams.BeforeCommit(s.flush),
		streams.OnBatchEnd(func(bool) { s.writer().Reset() }),
	}
}

// Run consumes the sink's topic into its table until ctx ends.
func (s *Sink) Run(ctx context.Context, kc streams.Cluster, opts ...streams.Option) error {
	return s.RunTasks(ctx, kc, 1, opts...)
}

// RunTasks consumes the sink's topic with n tasks, as Kafka Connect's
// tasks.max does: n members of the sink's group in this process, each with
// its own share of the partitions and its own row buffer. A store that runs
// inserts at once (ChDB's connection pool, a server) then inserts n batches
// in parallel; one insert alone leaves a core idle. The first task to fail
// stops the others.
func (s *Sink) RunTasks(ctx context.Context, kc streams.Cluster, n int, opts ...streams.Option) error {
	if s.store == nil {
		return fmt.Errorf("sink %s: no store bound", s.Name)
	}
	n = max(n, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, n)
	for range n {
		task := *s
		task.rows, task.m = nil, nil
		go func() {
			err := task.run(ctx, kc, opts)
			if err != nil {
				cancel()
			}
			errs <- err
		}()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *Sink) run(ctx context.Context, kc streams.Cluster, opts []streams.Option) error {
	opts = append(append([]streams.Option{streams.Kafka(kc)}, s.Options()...), opts...)
	r, err := streams.New(s.Name, s.Handle(), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// DeadLetters sinks the dead-letter topic, so operators can query why
// records were rejected.
func DeadLetters() *Sink {
	return &Sink{
		Name: "sink-dead-letters", Topic: schemas.TopicDeadLetter, Table: "dead_letters",
		Columns: Columns("source_topic String, source_partition Int32, source_offset Int64, processor String, reason String, schema_name String, key_hex String, value_bytes UInt32, at DateTime64ms"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			h := func(k string) string { v, _ := streams.Header(r, k); return v }
			part, err1 := strconv.Atoi(h(streams.HeaderDLQPartition))
			off, err2 := strconv.ParseInt(h(streams.HeaderDLQOffset), 10, 64)
			if err1 != nil || err2 != nil {
				return streams.Reject("dead letter without source position", nil)
			}
			size := len(r.Value)
			if t, ok := streams.Header(r, streams.HeaderDLQTruncated); ok {
				size, _ = strconv.Atoi(t)
			}
			w.Str(h(streams.HeaderDLQTopic))
			w.I32(int32(part))
			w.I64(off)
			w.Str(h(streams.HeaderDLQProcessor))
			w.Str(h(streams.HeaderDLQReason))
			w.Str(h(schemas.HeaderSchema))
			w.Str(hex.EncodeToString(r.Key))
			w.U32(uint32(size))
			w.Millis(r.Timestamp.UnixMilli())
			w.EndRow()
			return nil
		},
	}
}

// Presence sinks online-state changes.
func Presence() *Sink {
	return &Sink{
		Name: "sink-presence", Topic: schemas.TopicPresence, Table: "presence_changes",
		Columns: Columns("uin UInt32, online UInt8, at_ms Int64"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			var ev surgev1.LoginEvent
			if err := streams.Decode(r, &ev); err != nil {
				return err
			}
			if ev.Uin > 1<<32-1 {
				return streams.Reject(fmt.Sprintf("uin out of range: %d", ev.Uin), nil)
			}
			w.U32(uint32(ev.Uin))
			w.Bool(ev.Online)
			w.I64(ev.AtMs)
			w.EndRow()
			return nil
		},
	}
}

// ResetForBench drops the buffered rows, as a batch's end would.
func (s *Sink) ResetForBench() { s.writer().Reset() }

// FlushForBench inserts and clears the buffered rows, as a batch commit
// would; benchmarks drive the sink without a broker through it.
func (s *Sink) FlushForBench(ctx context.Context) error {
	err := s.flush(ctx)
	s.writer().Reset()
	return err
}
