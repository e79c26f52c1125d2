package clickhouse_test

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
)

// referenceRow writes the row the way the sinks did before FieldRows:
// decode the message with protobuf, then write each field's Go value.
func referenceRow(t *testing.T, s *clickhouse.Sink, r *kgo.Record) ([]byte, error) {
	t.Helper()
	msg := s.Message.ProtoReflect().New().Interface()
	if err := streams.Decode(r, msg); err != nil {
		return nil, err
	}
	w := clickhouse.NewRowWriter(s.Columns)
	m := msg.ProtoReflect()
	for _, name := range s.Fields {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
		v := m.Get(fd)
		switch fd.Kind() {
		case protoreflect.StringKind:
			w.Str(v.String())
		case protoreflect.EnumKind:
			w.Str(enumString(fd, v.Enum()))
		case protoreflect.Int64Kind:
			w.I64(v.Int())
		case protoreflect.Uint64Kind:
			w.U64(v.Uint())
		case protoreflect.BoolKind:
			w.Bool(v.Bool())
		default:
			t.Fatalf("%s: field %s of kind %s: extend this test", s.Name, name, fd.Kind())
		}
	}
	w.EndRow()
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	return w.Bytes(), nil
}

// enumString is the generated String method's answer: the name, or the
// number of a value this build does not know.
func enumString(fd protoreflect.FieldDescriptor, n protoreflect.EnumNumber) string {
	if v := fd.Enum().Values().ByNumber(n); v != nil {
		return string(v.Name())
	}
	return strconv.Itoa(int(n))
}

// randomMessage fills every field of a new message of the sink's schema:
// strings with multi-byte runes, negative and huge numbers, enum numbers
// this build does not know.
func randomMessage(rng *rand.Rand, msg proto.Message) {
	m := msg.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.IsList() || fd.IsMap() || rng.IntN(5) == 0 { // some fields absent
			continue
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(strings.Repeat("红包x", rng.IntN(4))+string(rune('a'+rng.IntN(26)))))
		case protoreflect.BytesKind:
			m.Set(fd, protoreflect.ValueOfBytes([]byte{byte(rng.IntN(256))}))
		case protoreflect.EnumKind:
			m.Set(fd, protoreflect.ValueOfEnum(protoreflect.EnumNumber(rng.IntN(12)-1)))
		case protoreflect.Int64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(rng.Int64()-rng.Int64()))
		case protoreflect.Uint64Kind:
			m.Set(fd, protoreflect.ValueOfUint64(rng.Uint64()))
		case protoreflect.Int32Kind:
			m.Set(fd, protoreflect.ValueOfInt32(rng.Int32()))
		case protoreflect.Uint32Kind:
			m.Set(fd, protoreflect.ValueOfUint32(rng.Uint32()))
		case protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(rng.IntN(2) == 0))
		case protoreflect.MessageKind: // a token's grant
			sub := m.NewField(fd).Message()
			randomMessage(rng, sub.Interface())
			m.Set(fd, protoreflect.ValueOfMessage(sub))
		}
	}
}

// TestFieldRowsMatchesProtobuf: for every sink written by FieldRows, the
// rows are byte for byte those of decoding with protobuf and writing the
// fields, and a record protobuf refuses is refused (dead-lettered).
func TestFieldRowsMatchesProtobuf(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed) // a failure reproduces with this seed
	rng := rand.New(rand.NewPCG(seed, 2))
	n := 0
	for _, s := range clickhouse.Facts() {
		if s.Fields == nil {
			continue
		}
		n++
		check := func(what string, r *kgo.Record) {
			t.Helper()
			want, wantErr := referenceRow(t, s, r)
			w := clickhouse.NewRowWriter(s.Columns)
			err := s.Write(r, w)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("%s, %s: FieldRows error %v, protobuf error %v (value %x)", s.Name, what, err, wantErr, r.Value)
			}
			if err != nil {
				if !streams.IsReject(err) {
					t.Fatalf("%s, %s: %v is not a rejection", s.Name, what, err)
				}
				return
			}
			if w.Err() != nil || !bytes.Equal(w.Bytes(), want) {
				t.Fatalf("%s, %s: row\n%x\nwant\n%x (%v)", s.Name, what, w.Bytes(), want, w.Err())
			}
		}
		for i := range 5000 {
			msg := s.Message.ProtoReflect().New().Interface()
			randomMessage(rng, msg)
			r, err := streams.NewRecord(s.Topic, nil, msg)
			if err != nil {
				t.Fatal(err)
			}
			check("random message", r)
			v := r.Value
			// Damaged encodings: cut anywhere, a byte flipped, unknown
			// fields appended, a field repeated (the last one wins).
			if len(v) > 0 {
				r.Value = v[:rng.IntN(len(v))]
				check("truncated", r)
				d := bytes.Clone(v)
				d[rng.IntN(len(d))] ^= byte(1 + rng.IntN(255))
				r.Value = d
				check("a byte changed", r)
			}
			r.Value = protowire.AppendString(protowire.AppendTag(bytes.Clone(v), 90, protowire.BytesType), "later field")
			check("unknown field", r)
			r.Value = append(bytes.Clone(v), v...)
			check("every field twice", r)
			if i%10 == 0 {
				// A known string field with bytes that are not UTF-8.
				r.Value = protowire.AppendBytes(protowire.AppendTag(bytes.Clone(v), 1, protowire.BytesType), []byte{0xff, 0xfe})
				check("invalid UTF-8", r)
				// A known field with a wire type it does not have.
				r.Value = protowire.AppendFixed32(protowire.AppendTag(bytes.Clone(v), 1, protowire.Fixed32Type), 7)
				check("wrong wire type", r)
				// A nested message (a token's grant) whose first field,
				// a string, is not UTF-8: protobuf refuses the record.
				fields := msg.ProtoReflect().Descriptor().Fields()
				for j := 0; j < fields.Len(); j++ {
					if fd := fields.Get(j); fd.Kind() == protoreflect.MessageKind && fd.Message().Fields().ByNumber(1).Kind() == protoreflect.StringKind {
						bad := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff, 0xfe})
						r.Value = protowire.AppendBytes(protowire.AppendTag(bytes.Clone(v), fd.Number(), protowire.BytesType), bad)
						check("invalid UTF-8 in a nested message", r)
					}
				}
			}
		}
	}
	if n < 4 { // grants, tokens, ledger, withdrawals
		t.Fatalf("%d sinks written by FieldRows; want at least 4", n)
	}
}

// FieldRows refuses, when a sink is built, what it could not read the way
// protobuf does: a nested message, a column of another kind, a field that
// does not exist.
func TestFieldRowsRefusesWhatItCannotRead(t *testing.T) {
	cases := map[string]func(){
		"nested message as a column": func() {
			clickhouse.FieldRows(&surgev1.Token{}, clickhouse.Columns("grant String"), "grant")
		},
		"kind mismatch": func() {
			clickhouse.FieldRows(&surgev1.RewardGrant{}, clickhouse.Columns("amount String"), "amount")
		},
		"no such field": func() {
			clickhouse.FieldRows(&surgev1.RewardGrant{}, clickhouse.Columns("x String"), "x")
		},
		"count mismatch": func() {
			clickhouse.FieldRows(&surgev1.RewardGrant{}, clickhouse.Columns("order_no String, act_id String"), "order_no")
		},
	}
	for name, build := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: FieldRows built a sink", name)
				}
			}()
			build()
		}()
	}
}

// The Go side of a wallet sink, per row: the handler (schema check, the
// walk into RowBinary) over a batch of grant records; no insert.
func BenchmarkGrantRows(b *testing.B) {
	s := clickhouse.Grants()
	h := s.Handle()
	recs := make([]*kgo.Record, 1000)
	for i := range recs {
		recs[i], _ = streams.NewRecord("wallet.grants", nil, &surgev1.RewardGrant{OrderNo: "u" + strconv.Itoa(i) + "_rain_r" + strconv.Itoa(i) + "_1_1",
			ActId: "u" + strconv.Itoa(i), ActivityId: "spring-live", ParentActivityId: "spring", SceneId: "rain",
			AwardType: surgev1.AwardType_CASH, Stage: 1, Amount: int64(1 + i%100), AtMs: 1764770000000})
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%len(recs) == 0 {
			s.ResetForBench()
		}
		if err := h(b.Context(), recs[i%len(recs)], nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// TestCashGrantsAreTheGrantsInsideTokens: sink-cash-grants writes, for a
// token carrying its grant, the row sink-grants writes for that grant on
// wallet.grants; a token without a grant gives no row; a token whose grant
// protobuf refuses is refused (dead-lettered; the ledger still books it).
func TestCashGrantsAreTheGrantsInsideTokens(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 3))
	cash, grants := clickhouse.CashGrants(), clickhouse.Grants()
	if cash.Table != grants.Table || len(cash.Columns) != len(grants.Columns) {
		t.Fatalf("sink-cash-grants writes %s %v, sink-grants %s %v", cash.Table, cash.Columns, grants.Table, grants.Columns)
	}
	rows := func(s *clickhouse.Sink, r *kgo.Record) ([]byte, int, error) {
		w := clickhouse.NewRowWriter(s.Columns)
		err := s.Write(r, w)
		return w.Bytes(), w.Rows(), err
	}
	for i := range 2000 {
		g := new(surgev1.RewardGrant)
		randomMessage(rng, g)
		tok := &surgev1.Token{OutTradeNo: g.OrderNo, ActId: g.ActId, Amount: g.Amount, Signature: []byte{1, 2}, Grant: g}
		tr, err := streams.NewRecord("wallet.tokens", nil, tok)
		if err != nil {
			t.Fatal(err)
		}
		gr, err := streams.NewRecord("wallet.grants", nil, g)
		if err != nil {
			t.Fatal(err)
		}
		got, n, err := rows(cash, tr)
		want, _, wantErr := rows(grants, gr)
		if err != nil || wantErr != nil || n != 1 || !bytes.Equal(got, want) {
			t.Fatalf("grant %d: %d rows %x (%v); sink-grants writes %x (%v)", i, n, got, err, want, wantErr)
		}
		if i%100 == 0 {
			tok.Grant = nil // an earlier build's token: its grant is on wallet.grants
			tr, _ = streams.NewRecord("wallet.tokens", nil, tok)
			if _, n, err := rows(cash, tr); n != 0 || err != nil {
				t.Fatalf("token without a grant: %d rows (%v), want none", n, err)
			}
			// The grant's order number not UTF-8.
			tr.Value = protowire.AppendBytes(protowire.AppendTag(tr.Value, 14, protowire.BytesType),
				protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0xff}))
			if _, n, err := rows(cash, tr); n != 0 || !streams.IsReject(err) {
				t.Fatalf("malformed grant: %d rows (%v), want a rejection", n, err)
			}
		}
	}
}

// A batch of recycle steps writes a row per ticket, the rows its tickets
// would write one record each; a batch with one bad uin writes none.
func TestRecycleStepBatchesWriteARowPerTicket(t *testing.T) {
	s := clickhouse.RecycleSteps()
	rows := func(m *surgev1.RecycleStep) ([]byte, int, error) {
		r, err := streams.NewRecord("uin.recycle-steps", nil, m)
		if err != nil {
			t.Fatal(err)
		}
		w := clickhouse.NewRowWriter(s.Columns)
		err = s.Write(r, w)
		return w.Bytes(), w.Rows(), err
	}
	var batch []*surgev1.RecycleStep
	var want []byte
	for u := uint64(1); u <= 5; u++ {
		st := &surgev1.RecycleStep{Uin: u, TicketId: "t" + strconv.FormatUint(u, 10), Step: surgev1.RecycleStepKind(u),
			ExpectedPrev: surgev1.RecycleStepKind(u - 1), Category: "inactive", Reason: "r", AtMs: int64(1000 * u)}
		one, n, err := rows(st)
		if err != nil || n != 1 {
			t.Fatalf("single step: %d rows, %v", n, err)
		}
		want = append(want, one...)
		batch = append(batch, st)
	}
	got, n, err := rows(&surgev1.RecycleStep{Batch: batch})
	if err != nil || n != 5 || !bytes.Equal(got, want) {
		t.Fatalf("batch: %d rows (%v), equal to the singles' rows: %v", n, err, bytes.Equal(got, want))
	}
	batch = append(batch, &surgev1.RecycleStep{Uin: 1 << 40})
	if _, n, err := rows(&surgev1.RecycleStep{Batch: batch}); n != 0 || !streams.IsReject(err) {
		t.Fatalf("batch with a uin out of range: %d rows (%v), want a rejection and none", n, err)
	}
}
