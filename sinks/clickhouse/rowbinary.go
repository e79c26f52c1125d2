package clickhouse

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"
)

// Type is a column type a sink writes. LowCardinality(String) columns take
// String; DateTime64(3) columns take DateTime64ms (milliseconds).
type Type uint8

// Column types.
const (
	String Type = iota + 1
	Int32
	Int64
	UInt8
	UInt32
	UInt64
	DateTime64ms
)

var typeNames = map[string]Type{"String": String, "Int32": Int32, "Int64": Int64, "UInt8": UInt8,
	"UInt32": UInt32, "UInt64": UInt64, "DateTime64ms": DateTime64ms}

// Column is one column of a sink's table.
type Column struct {
	Name string
	Type Type
}

// Columns parses "name Type, name Type, ..." (types as in typeNames); a bad
// spec is a programming error and panics at package init.
func Columns(spec string) []Column {
	var cols []Column
	for _, f := range strings.Split(spec, ",") {
		parts := strings.Fields(f)
		if len(parts) != 2 || typeNames[parts[1]] == 0 {
			panic(fmt.Sprintf("clickhouse: bad column spec %q", f))
		}
		cols = append(cols, Column{Name: parts[0], Type: typeNames[parts[1]]})
	}
	return cols
}

func names(cols []Column) string {
	n := make([]string, len(cols))
	for i, c := range cols {
		n[i] = c.Name
	}
	return strings.Join(n, ", ")
}

// RowWriter appends rows in ClickHouse's RowBinary format: the one encoding
// both drivers take (chDB reads it as it is; the server driver decodes it
// into columns). A row is its values in column order, then EndRow.
type RowWriter struct {
	cols []Column
	buf  []byte
	rows int
	vals int // values written in the current row
	err  error
}

// NewRowWriter returns a writer for rows of cols.
func NewRowWriter(cols []Column) *RowWriter { return &RowWriter{cols: cols} }

func (w *RowWriter) next(t Type) {
	if w.vals >= len(w.cols) || w.cols[w.vals].Type != t {
		if w.err == nil {
			w.err = fmt.Errorf("clickhouse: row %d value %d does not match the columns %s", w.rows, w.vals, names(w.cols))
		}
	}
	w.vals++
}

// Str appends a String (or LowCardinality(String)) value.
func (w *RowWriter) Str(s string) {
	w.next(String)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(s)))
	w.buf = append(w.buf, s...)
}

// StrBytes appends a String value held as bytes.
func (w *RowWriter) StrBytes(s []byte) {
	w.next(String)
	w.buf = binary.AppendUvarint(w.buf, uint64(len(s)))
	w.buf = append(w.buf, s...)
}

// I32 appends an Int32.
func (w *RowWriter) I32(v int32) {
	w.next(Int32)
	w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(v))
}

// I64 appends an Int64.
func (w *RowWriter) I64(v int64) {
	w.next(Int64)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, uint64(v))
}

// U8 appends a UInt8.
func (w *RowWriter) U8(v uint8) { w.next(UInt8); w.buf = append(w.buf, v) }

// Bool appends a UInt8 0 or 1.
func (w *RowWriter) Bool(v bool) {
	var b uint8
	if v {
		b = 1
	}
	w.U8(b)
}

// U32 appends a UInt32.
func (w *RowWriter) U32(v uint32) {
	w.next(UInt32)
	w.buf = binary.LittleEndian.AppendUint32(w.buf, v)
}

// U64 appends a UInt64.
func (w *RowWriter) U64(v uint64) {
	w.next(UInt64)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, v)
}

// Millis appends a DateTime64(3) as milliseconds since the epoch.
func (w *RowWriter) Millis(ms int64) {
	w.next(DateTime64ms)
	w.buf = binary.LittleEndian.AppendUint64(w.buf, uint64(ms))
}

// EndRow closes a row; it must hold exactly one value per column.
func (w *RowWriter) EndRow() {
	if w.vals != len(w.cols) && w.err == nil {
		w.err = fmt.Errorf("clickhouse: row %d has %d values for %d columns (%s)", w.rows, w.vals, len(w.cols), names(w.cols))
	}
	w.vals = 0
	w.rows++
}

// Rows is the number of complete rows.
func (w *RowWriter) Rows() int { return w.rows }

// Bytes is the encoded rows.
func (w *RowWriter) Bytes() []byte { return w.buf }

// Err is the first mismatch between the values written and the columns.
func (w *RowWriter) Err() error { return w.err }

type mark struct{ buf, rows int }

func (w *RowWriter) mark() mark { return mark{len(w.buf), w.rows} }

// undo drops everything written since m (a record rejected half-way).
func (w *RowWriter) undo(m mark) { w.buf, w.rows, w.vals = w.buf[:m.buf], m.rows, 0 }

// Reset empties the writer for the next batch.
func (w *RowWriter) Reset() { w.buf, w.rows, w.vals, w.err = w.buf[:0], 0, 0, nil }

// DecodeColumns turns RowBinary rows of cols back into one Go slice per
// column ([]string, []int32, []int64, []uint8, []uint32, []uint64 or
// []time.Time): the server driver's columnar insert takes these.
func DecodeColumns(cols []Column, rows int, data []byte) ([]any, error) {
	out := make([]any, len(cols))
	for i, c := range cols {
		switch c.Type {
		case String:
			out[i] = make([]string, 0, rows)
		case Int32:
			out[i] = make([]int32, 0, rows)
		case Int64:
			out[i] = make([]int64, 0, rows)
		case UInt8:
			out[i] = make([]uint8, 0, rows)
		case UInt32:
			out[i] = make([]uint32, 0, rows)
		case UInt64:
			out[i] = make([]uint64, 0, rows)
		case DateTime64ms:
			out[i] = make([]time.Time, 0, rows)
		}
	}
	short := fmt.Errorf("clickhouse: RowBinary data ends inside a row")
	for r := 0; r < rows; r++ {
		for i, c := range cols {
			switch c.Type {
			case String:
				n, k := binary.Uvarint(data)
				if k <= 0 || n > math.MaxInt32 || uint64(len(data)-k) < n {
					return nil, short
				}
				out[i] = append(out[i].([]string), string(data[k:k+int(n)]))
				data = data[k+int(n):]
				continue
			case UInt8:
				if len(data) < 1 {
					return nil, short
				}
				out[i] = append(out[i].([]uint8), data[0])
				data = data[1:]
				continue
			}
			size := 8
			if c.Type == Int32 || c.Type == UInt32 {
				size = 4
			}
			if len(data) < size {
				return nil, short
			}
			switch c.Type {
			case Int32:
				out[i] = append(out[i].([]int32), int32(binary.LittleEndian.Uint32(data)))
			case UInt32:
				out[i] = append(out[i].([]uint32), binary.LittleEndian.Uint32(data))
			case Int64:
				out[i] = append(out[i].([]int64), int64(binary.LittleEndian.Uint64(data)))
			case UInt64:
				out[i] = append(out[i].([]uint64), binary.LittleEndian.Uint64(data))
			case DateTime64ms:
				out[i] = append(out[i].([]time.Time), time.UnixMilli(int64(binary.LittleEndian.Uint64(data))).UTC())
			}
			data = data[size:]
		}
	}
	if len(data) != 0 {
		return nil, fmt.Errorf("clickhouse: %d bytes of RowBinary data after %d rows", len(data), rows)
	}
	return out, nil
}
