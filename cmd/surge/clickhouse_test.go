package main

import (
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"surge/sinks/clickhouse"
)

// `surge clickhouse serve` is the one process that opens the chDB
// directory; other processes use it through clickhouse.dsn as they would a
// ClickHouse server: two `surge recon report` at once, and the server
// driver from this test writing and reading a table. A wrong password is
// refused with ClickHouse's answer.
func TestClickhouseServeForOtherProcesses(t *testing.T) {
	if os.Getenv("CHDB_LIB_PATH") == "" {
		t.Skip("no chDB (scripts/chdb.sh installs it; CHDB_LIB_PATH names it)")
	}
	if _, err := clickhouse.OpenChDB(t.TempDir()); err != nil && strings.Contains(err.Error(), "without chDB") {
		t.Skip("built without -tags chdb")
	}
	addr := freePort(t)
	const pass = "a-clickhouse-password-for-the-test"
	serveEnv := []string{"SURGE_CLICKHOUSE_PASSWORD=" + pass, "SURGE_CLICKHOUSE_USERNAME=surge", "SURGE_CLICKHOUSE_CHDB_DIR=" + t.TempDir(),
		"SURGE_CLICKHOUSE_SERVE_ADDR=" + addr, "SURGE_LOG_LEVEL=info"}
	srv := runCommand(t, serveEnv, "clickhouse", "clickhouse", "serve")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			srv.mu.Lock()
			t.Fatalf("clickhouse serve never listened:\n%s", srv.log.String())
		}
	}
	dsn := "http://" + addr + "/default"
	client := []string{"SURGE_CLICKHOUSE_DSN=" + dsn, "SURGE_CLICKHOUSE_USERNAME=surge", "SURGE_CLICKHOUSE_PASSWORD=" + pass}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, code := runToEnd(t, client, "recon", "report"); code != 0 {
				t.Errorf("surge recon report through clickhouse serve: exit %d\n%s", code, out)
			}
		}()
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := clickhouse.OpenServerWith(ctx, dsn, clickhouse.ServerAuth{Username: "surge", Password: pass})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Exec(ctx, "CREATE TABLE IF NOT EXISTS served_t (k UInt32, v String) ENGINE = MergeTree ORDER BY k"); err != nil {
		t.Fatal(err)
	}
	if err := st.Exec(ctx, "INSERT INTO served_t VALUES (1, 'a'), (2, 'b')"); err != nil {
		t.Fatal(err)
	}
	if rows, err := st.QueryStrings(ctx, "SELECT count() FROM served_t"); err != nil || len(rows) != 1 || rows[0][0] != "2" {
		t.Fatalf("count: %v, %v", rows, err)
	}
	bad := []string{"SURGE_CLICKHOUSE_DSN=" + dsn, "SURGE_CLICKHOUSE_USERNAME=surge", "SURGE_CLICKHOUSE_PASSWORD=wrong"}
	if out, code := runToEnd(t, bad, "recon", "report"); code == 0 || !strings.Contains(out, "Authentication failed") {
		t.Fatalf("a wrong password: exit %d\n%s", code, out)
	}
	// On an address other than loopback, no password: refused at start.
	if out, code := runToEnd(t, []string{"SURGE_CLICKHOUSE_SERVE_ADDR=0.0.0.0:0", "SURGE_CLICKHOUSE_CHDB_DIR=" + t.TempDir()}, "clickhouse", "serve"); code == 0 || !strings.Contains(out, "clickhouse.password") {
		t.Fatalf("serving everyone without a password: exit %d\n%s", code, out)
	}
}
