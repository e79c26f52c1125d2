package clickhouse

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
)

// RowFunc maps one record to a VALUES tuple such as "(1, 'a')", or rejects it.
type RowFunc func(r *kgo.Record) (string, error)

// Sink batches a topic's records into one table. Rows are inserted before
// the batch's offsets commit (streams.BeforeCommit) and the tables are
// ReplacingMergeTree keyed by each record's identity, so a redelivered
// batch replaces rows rather than doubling them: at-least-once delivery,
// exactly-once rows after merges (and with FINAL in queries).
type Sink struct {
	Name    string
	Topic   string
	Table   string
	Columns []string
	Row     RowFunc
	// Rows, when set instead of Row, maps one record to many rows (a
	// batch record such as a delivery report).
	Rows func(r *kgo.Record) ([]string, error)

	store Store
	rows  []string
}

// Bind attaches a store.
func (s *Sink) Bind(st Store) *Sink { s.store = st; return s }

// Handle is the streams handler: it only buffers.
func (s *Sink) Handle() streams.Handler {
	return func(_ context.Context, in *kgo.Record, _ *streams.Output) error {
		if s.Rows != nil {
			rows, err := s.Rows(in)
			if err != nil {
				return err
			}
			s.rows = append(s.rows, rows...)
			return nil
		}
		row, err := s.Row(in)
		if err != nil {
			return err
		}
		s.rows = append(s.rows, row)
		return nil
	}
}

// flush inserts the buffered rows in one statement.
func (s *Sink) flush(ctx context.Context) error {
	if len(s.rows) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s (%s) VALUES ", s.Table, strings.Join(s.Columns, ", "))
	for i, r := range s.rows {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r)
	}
	return s.store.Exec(ctx, b.String())
}

// Options are the runtime options a sink needs.
func (s *Sink) Options() []streams.Option {
	return []streams.Option{
		streams.Inputs(s.Topic),
		streams.WithGuarantee(streams.AtLeastOnce),
		streams.BeforeCommit(s.flush),
		streams.OnBatchEnd(func(bool) { s.rows = s.rows[:0] }),
	}
}

// Run consumes the sink's topic into its table until ctx ends.
func (s *Sink) Run(ctx context.Context, brokers []string, opts ...streams.Option) error {
	if s.store == nil {
		return fmt.Errorf("sink %s: no store bound", s.Name)
	}
	opts = append(append([]streams.Option{streams.Brokers(brokers...)}, s.Options()...), opts...)
	r, err := streams.New(s.Name, s.Handle(), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func ms(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64) }

// DeadLetters sinks the dead-letter topic, so operators can query why
// records were rejected.
func DeadLetters() *Sink {
	return &Sink{
		Name: "sink-dead-letters", Topic: schemas.TopicDeadLetter, Table: "dead_letters",
		Columns: []string{"source_topic", "source_partition", "source_offset", "processor", "reason", "schema_name", "key_hex", "value_bytes", "at"},
		Row: func(r *kgo.Record) (string, error) {
			h := func(k string) string { v, _ := streams.Header(r, k); return v }
			part, err1 := strconv.Atoi(h(streams.HeaderDLQPartition))
			off, err2 := strconv.ParseInt(h(streams.HeaderDLQOffset), 10, 64)
			if err1 != nil || err2 != nil {
				return "", streams.Reject("dead letter without source position", nil)
			}
			size := len(r.Value)
			if t, ok := streams.Header(r, streams.HeaderDLQTruncated); ok {
				size, _ = strconv.Atoi(t)
			}
			return fmt.Sprintf("(%s, %d, %d, %s, %s, %s, %s, %d, %s)",
				Quote(h(streams.HeaderDLQTopic)), part, off, Quote(h(streams.HeaderDLQProcessor)),
				Quote(h(streams.HeaderDLQReason)), Quote(h(schemas.HeaderSchema)), Quote(hex.EncodeToString(r.Key)),
				size, ms(r.Timestamp)), nil
		},
	}
}

// Presence sinks online-state changes.
func Presence() *Sink {
	return &Sink{
		Name: "sink-presence", Topic: schemas.TopicPresence, Table: "presence_changes",
		Columns: []string{"uin", "online", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var ev surgev1.LoginEvent
			if err := streams.Decode(r, &ev); err != nil {
				return "", err
			}
			on := 0
			if ev.Online {
				on = 1
			}
			return fmt.Sprintf("(%d, %d, %d)", ev.Uin, on, ev.AtMs), nil
		},
	}
}

// FlushForBench inserts and clears the buffered rows, as a batch commit
// would; benchmarks drive the sink without a broker through it.
func (s *Sink) FlushForBench(ctx context.Context) error {
	err := s.flush(ctx)
	s.rows = s.rows[:0]
	return err
}
