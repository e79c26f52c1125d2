package chdbhttp_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"surge/sinks/clickhouse"
	"surge/sinks/clickhouse/chdbhttp"
)

func endpoint(t *testing.T) *chdbhttp.Endpoint {
	t.Helper()
	db, err := clickhouse.OpenChDB("", clickhouse.ChDBConnections(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ep, err := chdbhttp.Listen(db, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ep.Close() })
	return ep
}

// What the endpoint does not implement is refused with 501 and says what,
// never answered wrongly; the engine's errors keep their code.
func TestRefusesWhatItDoesNotServe(t *testing.T) {
	ep := endpoint(t)
	ctx := context.Background()
	url := strings.Replace(ep.DSN(), "/default", "/", 1)

	_, err := clickhouse.OpenServer(ctx, ep.DSN()+"?compress=lz4")
	if err == nil || !strings.Contains(err.Error(), "501") || !strings.Contains(err.Error(), "compress") {
		t.Fatalf("native compression: %v", err)
	}
	for _, c := range []struct {
		name, query, body, want string
		status                  int
	}{
		{"a setting on a query", "?max_threads=2", "SELECT 1", "settings on a query (max_threads = '2')", 501},
		{"a query parameter", "?param_x=1", "SELECT {x:UInt8}", "query parameter param_x", 501},
		{"a URL query other than a Native insert", "?query=SELECT+1", "", "other than INSERT ... FORMAT Native", 501},
		{"a missing table", "", "SELECT * FROM nowhere_at_all", "nowhere_at_all", 500},
	} {
		resp, err := http.Post(url+c.query, "text/plain", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		var msg strings.Builder
		_, _ = io.Copy(&msg, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(msg.String(), c.want) {
			t.Errorf("%s: %d %q, want %d with %q", c.name, resp.StatusCode, msg.String(), c.status, c.want)
		}
		if c.status == 500 && resp.Header.Get("X-ClickHouse-Exception-Code") != "60" {
			t.Errorf("%s: exception code header %q, want 60 (UNKNOWN_TABLE)", c.name, resp.Header.Get("X-ClickHouse-Exception-Code"))
		}
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %s", resp.Status)
	}
}

// An empty result with a LowCardinality column (what `surge recon report`
// asks of an empty recon_results) reads as no rows, and the next query on
// the connection works: clickhouse-go decodes an empty block without the
// column's state prefix its encoder would write.
func TestEmptyLowCardinalityResult(t *testing.T) {
	ep := endpoint(t)
	ctx := context.Background()
	st, err := clickhouse.OpenServer(ctx, ep.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, q := range []string{
		"SELECT toLowCardinality('x') AS c, 1 AS n WHERE 0",
		"SELECT [toLowCardinality('x')] AS c, toNullable(toLowCardinality('y')) AS d WHERE 0",
	} {
		rows, err := st.QueryStrings(ctx, q)
		if err != nil || len(rows) != 0 {
			t.Fatalf("%s: %v, %v", q, rows, err)
		}
	}
	rows, err := st.QueryStrings(ctx, "SELECT toLowCardinality('x') AS c, 1 AS n")
	if err != nil || len(rows) != 1 || rows[0][0] != "x" || rows[0][1] != "1" {
		t.Fatalf("a row: %v, %v", rows, err)
	}
}
