package clickhouse

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// What a RowWriter encodes, DecodeColumns (the server driver's path) reads
// back value for value.
func TestRowBinaryRoundTrip(t *testing.T) {
	cols := Columns("s String, i Int32, l Int64, b UInt8, u UInt32, w UInt64, at DateTime64ms")
	w := NewRowWriter(cols)
	at := time.Date(2026, 12, 3, 10, 0, 0, 123e6, time.UTC)
	for i, s := range []string{"", "ü ' \\ \n", strings.Repeat("x", 300)} {
		w.Str(s)
		w.I32(int32(-i))
		w.I64(-1 << 40)
		w.Bool(i%2 == 1)
		w.U32(1<<32 - 1)
		w.U64(1<<64 - 1)
		w.Millis(at.UnixMilli())
		w.EndRow()
	}
	if w.Err() != nil || w.Rows() != 3 {
		t.Fatalf("rows %d err %v", w.Rows(), w.Err())
	}
	got, err := DecodeColumns(cols, w.Rows(), w.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		[]string{"", "ü ' \\ \n", strings.Repeat("x", 300)},
		[]int32{0, -1, -2},
		[]int64{-1 << 40, -1 << 40, -1 << 40},
		[]uint8{0, 1, 0},
		[]uint32{1<<32 - 1, 1<<32 - 1, 1<<32 - 1},
		[]uint64{1<<64 - 1, 1<<64 - 1, 1<<64 - 1},
		[]time.Time{at, at, at},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %v\nwant %v", got, want)
	}
	if _, err := DecodeColumns(cols, 4, w.Bytes()); err == nil {
		t.Fatal("a fourth row out of three decoded")
	}
	if _, err := DecodeColumns(cols, 2, w.Bytes()); err == nil {
		t.Fatal("trailing bytes not reported")
	}
}

// A row that disagrees with the columns (a value of the wrong type, one
// too few) is reported; undo drops a half-written row.
func TestRowWriterChecksRowsAgainstColumns(t *testing.T) {
	cols := Columns("a String, b Int64")
	w := NewRowWriter(cols)
	w.Str("x")
	w.I32(1)
	w.EndRow()
	if w.Err() == nil {
		t.Fatal("Int32 into an Int64 column not reported")
	}
	w.Reset()
	w.Str("x")
	w.EndRow()
	if w.Err() == nil {
		t.Fatal("a short row not reported")
	}
	w.Reset()
	w.Str("kept")
	w.I64(1)
	w.EndRow()
	m := w.mark()
	w.Str("dropped")
	w.undo(m)
	if w.Rows() != 1 || w.Err() != nil {
		t.Fatalf("after undo: %d rows, %v", w.Rows(), w.Err())
	}
	got, err := DecodeColumns(cols, 1, w.Bytes())
	if err != nil || got[0].([]string)[0] != "kept" {
		t.Fatalf("%v %v", got, err)
	}
}
