// Package chdbhttp serves a chDB database over the part of ClickHouse's
// HTTP interface that clickhouse-go v2 speaks in its HTTP protocol. No
// ClickHouse server can be installed on the machines this repository is
// built on, so this is how the server driver (clickhouse.Server, the one
// operators run against a real server) runs in the tests against the real
// engine: the same DDL, the same inserts and queries, through the driver's
// own encoding.
//
// Served, as ClickHouse serves them:
//   - a query in the request body, answered in Native blocks of the
//     client's protocol revision (the driver's hello, DESCRIBE TABLE,
//     SELECTs) or with an empty body (DDL, INSERT ... VALUES);
//   - a query in the URL ("INSERT INTO t (...) FORMAT Native") with Native
//     blocks in the body: a batch insert; URL settings go with it;
//   - errors: the engine's message with status 500 and the
//     X-ClickHouse-Exception-Code header.
//
// Not served (a clear 501, never a wrong answer): HTTP or native
// compression, query parameters, external tables, settings on a query
// other than an insert, except the few that cannot change a query's answer
// (droppedOnQueries), which the driver sends on every query of a context
// that carries them.
package chdbhttp

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	chproto "github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"

	"surge/sinks/clickhouse"
)

// Endpoint is a running HTTP endpoint in front of a chDB database.
type Endpoint struct {
	db    *clickhouse.ChDB
	ln    net.Listener
	srv   *http.Server
	spool string
}

// New is the endpoint as an http.Handler, for a server of the caller's
// (`surge clickhouse serve` puts RequireUser in front of it).
func New(db *clickhouse.ChDB) *Endpoint { return &Endpoint{db: db, spool: os.TempDir()} }

// RequireUser answers a request without user and password as ClickHouse
// does (401, exception code 516), taking them as ClickHouse's HTTP
// interface does: basic authentication (clickhouse-go's HTTP protocol) or
// the X-ClickHouse-User and X-ClickHouse-Key headers.
func RequireUser(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok {
			u, p = r.Header.Get("X-ClickHouse-User"), r.Header.Get("X-ClickHouse-Key")
		}
		if u == "" {
			u = "default"
		}
		if subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("X-ClickHouse-Exception-Code", "516")
			w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, "Code: 516. DB::Exception: "+u+": Authentication failed: password is incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Listen serves db on addr ("127.0.0.1:0" picks a free port) until Close.
func Listen(db *clickhouse.ChDB, addr string) (*Endpoint, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("chdbhttp: %w", err)
	}
	e := &Endpoint{db: db, ln: ln, spool: os.TempDir()}
	e.srv = &http.Server{Handler: e}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
}

// DSN is a clickhouse-go DSN for the endpoint.
func (e *Endpoint) DSN() string { return "http://" + e.ln.Addr().String() + "/default" }

// Close stops serving; the database stays open.
func (e *Endpoint) Close() error { return e.srv.Close() }

// Parameters of a request that are not query settings.
var notSettings = map[string]bool{
	"database": true, "default_format": true, "client_protocol_version": true,
	"query_id": true, "quota_key": true, "query": true,
}

// Settings dropped on a query other than an insert: a time limit (the
// client's context still bounds its wait) and insert-only settings, which a
// batch's context also carries onto its DESCRIBE TABLE.
var droppedOnQueries = map[string]bool{"max_execution_time": true, "optimize_on_insert": true}

// Parameters that change the wire format: refused rather than ignored.
var unserved = map[string]bool{"compress": true, "decompress": true, "enable_http_compression": true}

var insertNative = regexp.MustCompile(`(?is)^\s*(INSERT\s+INTO\s+.+?)\s+FORMAT\s+Native\s*$`)

// errNotServed marks a request this endpoint does not implement.
var errNotServed = errors.New("not served by chdbhttp")

func (e *Endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "chdbhttp: POST only", http.StatusMethodNotAllowed)
		return
	}
	out, err := e.serve(r)
	switch {
	case errors.Is(err, errNotServed):
		http.Error(w, "chdbhttp: "+err.Error(), http.StatusNotImplemented)
	case err != nil:
		msg := err.Error()
		if m := exceptionCode.FindStringSubmatch(msg); m != nil {
			w.Header().Set("X-ClickHouse-Exception-Code", m[1])
		}
		w.Header().Set("Content-Type", "text/plain; charset=UTF-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, msg)
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(out)
	}
}

var exceptionCode = regexp.MustCompile(`Code: (\d+)\.`)

func (e *Endpoint) serve(r *http.Request) ([]byte, error) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" {
		return nil, fmt.Errorf("%w: Content-Encoding %s", errNotServed, enc)
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
		return nil, fmt.Errorf("%w: external tables", errNotServed)
	}
	params := r.URL.Query()
	var settings []string
	for k := range params {
		switch {
		case unserved[k]:
			return nil, fmt.Errorf("%w: parameter %s", errNotServed, k)
		case strings.HasPrefix(k, "param_"):
			return nil, fmt.Errorf("%w: query parameter %s", errNotServed, k)
		case droppedOnQueries[k] && params.Get("query") == "":
			// dropped (droppedOnQueries)
		case !notSettings[k]:
			settings = append(settings, k+" = "+clickhouse.Quote(params.Get(k)))
		}
	}
	sort.Strings(settings)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	if q := params.Get("query"); q != "" {
		return nil, e.insert(r.Context(), q, body, settings)
	}
	if len(settings) > 0 {
		return nil, fmt.Errorf("%w: settings on a query (%s)", errNotServed, strings.Join(settings, ", "))
	}
	revision, err := strconv.ParseUint(params.Get("client_protocol_version"), 10, 64)
	if err != nil {
		revision = 0 // a client without it reads Native blocks without block info
	}
	return e.query(r.Context(), string(body), revision)
}

// insert runs "INSERT INTO t (...) FORMAT Native" with the Native blocks
// of body. chDB takes data only beside a query string, so the blocks go
// through a file, as clickhouse.ChDB.Insert does with RowBinary.
func (e *Endpoint) insert(ctx context.Context, q string, body []byte, settings []string) error {
	m := insertNative.FindStringSubmatch(q)
	if m == nil {
		return fmt.Errorf("%w: a query in the URL other than INSERT ... FORMAT Native: %q", errNotServed, q)
	}
	f, err := os.CreateTemp(e.spool, "chdbhttp-*.native")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	sql := m[1] + " FROM INFILE " + clickhouse.Quote(f.Name())
	if len(settings) > 0 {
		sql += " SETTINGS " + strings.Join(settings, ", ")
	}
	_, err = e.db.Query(ctx, sql+" FORMAT Native", "CSV")
	return err
}

// result is chDB's JSONCompactStrings output: column names and types, and
// every value as text (null for NULL).
type result struct {
	Meta []struct{ Name, Type string }
	Data [][]*string
}

// query runs a statement and answers with one Native block of the
// client's revision, or nothing when the statement returns no columns.
func (e *Endpoint) query(ctx context.Context, sql string, revision uint64) ([]byte, error) {
	out, err := e.db.Query(ctx, sql, "JSONCompactStrings")
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(out) == "" {
		return nil, nil // DDL, INSERT ... VALUES
	}
	var res result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return nil, fmt.Errorf("chdbhttp: engine output: %w", err)
	}
	block := proto.NewBlock()
	for _, c := range res.Meta {
		typ := c.Type
		if len(res.Data) == 0 {
			// ClickHouse sends no data at all for a column of an empty
			// block; clickhouse-go's encoder still writes LowCardinality's
			// state prefix, which its decoder does not read for no rows
			// (the next column's name is then misread). An empty column's
			// type without the wrapper reads the same, as nothing.
			typ = withoutLowCardinality(typ)
		}
		if err := block.AddColumn(c.Name, column.Type(typ)); err != nil {
			return nil, fmt.Errorf("%w: column %s of type %s: %v", errNotServed, c.Name, c.Type, err)
		}
	}
	row := make([]any, len(res.Meta))
	for _, vals := range res.Data {
		for i, c := range res.Meta {
			if row[i], err = typed(c.Type, vals[i]); err != nil {
				return nil, fmt.Errorf("column %s: %w", c.Name, err)
			}
		}
		if err := block.Append(row...); err != nil {
			return nil, fmt.Errorf("chdbhttp: %w", err)
		}
	}
	buf := new(chproto.Buffer)
	if err := block.Encode(buf, revision); err != nil {
		return nil, fmt.Errorf("chdbhttp: %w", err)
	}
	return buf.Buf, nil
}

// withoutLowCardinality is typ with its LowCardinality wrappers removed,
// at the top and inside Array and Nullable.
func withoutLowCardinality(typ string) string {
	for _, w := range []string{"LowCardinality(", "Array(", "Nullable("} {
		if inner, ok := strings.CutPrefix(typ, w); ok && strings.HasSuffix(inner, ")") {
			inner = withoutLowCardinality(inner[:len(inner)-1])
			if w == "LowCardinality(" {
				return inner
			}
			return w + inner + ")"
		}
	}
	return typ
}

// typed turns a value's text into the Go value clickhouse-go's column of
// that type appends.
func typed(typ string, s *string) (any, error) {
	if inner, ok := strings.CutPrefix(typ, "Nullable("); ok {
		if s == nil {
			return nil, nil
		}
		return typed(strings.TrimSuffix(inner, ")"), s)
	}
	if inner, ok := strings.CutPrefix(typ, "LowCardinality("); ok {
		return typed(strings.TrimSuffix(inner, ")"), s)
	}
	if s == nil {
		return nil, fmt.Errorf("NULL in %s", typ)
	}
	v := *s
	switch {
	case typ == "String" || strings.HasPrefix(typ, "FixedString("):
		return v, nil
	case typ == "Bool":
		return v == "true", nil
	case typ == "Float32":
		f, err := strconv.ParseFloat(v, 32)
		return float32(f), err
	case typ == "Float64":
		return strconv.ParseFloat(v, 64)
	case strings.HasPrefix(typ, "UInt"):
		bits, _ := strconv.Atoi(typ[4:])
		n, err := strconv.ParseUint(v, 10, bits)
		switch bits {
		case 8:
			return uint8(n), err
		case 16:
			return uint16(n), err
		case 32:
			return uint32(n), err
		case 64:
			return n, err
		}
	case strings.HasPrefix(typ, "Int"):
		bits, _ := strconv.Atoi(typ[3:])
		n, err := strconv.ParseInt(v, 10, bits)
		switch bits {
		case 8:
			return int8(n), err
		case 16:
			return int16(n), err
		case 32:
			return int32(n), err
		case 64:
			return n, err
		}
	}
	return nil, fmt.Errorf("%w: values of type %s", errNotServed, typ)
}
