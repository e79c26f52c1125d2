package clickhouse_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"surge/sinks/clickhouse"
)

// Every migration has a cluster form, and the forms have the shape a
// replicated, sharded deployment needs; ClickHouse's own parser (chDB's
// EXPLAIN AST) accepts each statement.
func TestMigrationsOnACluster(t *testing.T) {
	c := clickhouse.Cluster{Name: "surge"}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations: %v %v", files, err)
	}
	sort.Strings(files)
	all := map[string][]string{}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		stmts, err := c.Rewrite(string(body))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		all[filepath.Base(f)] = stmts
		for _, s := range stmts {
			if !strings.Contains(s, "ON CLUSTER `surge`") && !strings.HasPrefix(s, "INSERT INTO") {
				t.Errorf("%s: a DDL statement without ON CLUSTER:\n%s", f, s)
			}
			if _, err := store.QueryStrings(context.Background(), "SELECT formatQuery("+clickhouse.Quote(s)+")"); err != nil {
				t.Errorf("%s: ClickHouse does not parse\n%s\n: %v", f, s, err)
			}
		}
	}
	presence := all["0002_presence.sql"]
	if len(presence) != 2 {
		t.Fatalf("a table is a local and a Distributed table, got %d statements", len(presence))
	}
	want := []string{
		"CREATE TABLE IF NOT EXISTS presence_changes_local ON CLUSTER `surge`",
		"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/presence_changes_local', '{replica}')",
	}
	for _, w := range want {
		if !strings.Contains(presence[0], w) {
			t.Errorf("local table lacks %q:\n%s", w, presence[0])
		}
	}
	if got, w := presence[1], "CREATE TABLE IF NOT EXISTS presence_changes ON CLUSTER `surge` AS presence_changes_local ENGINE = Distributed('surge', currentDatabase(), presence_changes_local, cityHash64(uin, at_ms))"; got != w {
		t.Errorf("distributed table:\n got %s\nwant %s", got, w)
	}
	// An engine's own arguments follow the replication ones.
	withArgs := regexp.MustCompile(`ReplicatedReplacingMergeTree\('[^']+', '\{replica\}', (at_ms|run_at_ms)\)`)
	n := 0
	for _, stmts := range all {
		n += len(withArgs.FindAllString(strings.Join(stmts, "\n"), -1))
	}
	if n != 2 {
		t.Errorf("%d tables kept their engine's version column, want 2", n)
	}
	// Views fold each shard's own inserts; ALTERs reach both tables.
	if v := all["0010_wallet_orders_grants.sql"][0]; !strings.Contains(v, "TO wallet_orders_local AS") || !strings.Contains(v, "FROM grants_local") {
		t.Errorf("materialized view not on the local tables:\n%s", v)
	}
	if a := all["0016_wallet_low_cardinality.sql"]; len(a) != 2 || !strings.Contains(a[0], "ALTER TABLE grants_local ON CLUSTER") || !strings.Contains(a[1], "ALTER TABLE grants ON CLUSTER") {
		t.Errorf("ALTER not on both tables: %q", a)
	}
	if _, err := c.Rewrite("DROP TABLE grants"); err == nil {
		t.Error("a statement with no cluster form was rewritten")
	}
}

// MigrateCluster runs every statement in its cluster form, and keeps its
// record of applied migrations replicated on the cluster too.
func TestMigrateClusterRunsTheClusterForms(t *testing.T) {
	rec := &recordingStore{}
	did, err := clickhouse.MigrateCluster(context.Background(), rec, clickhouse.Cluster{Name: "surge", ZooPath: "/ch/t/"})
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("migrations/*.sql")
	if len(did) != len(files) {
		t.Fatalf("applied %d migrations, want %d", len(did), len(files))
	}
	if !strings.Contains(rec.stmts[0], "schema_migrations ON CLUSTER `surge`") || !strings.Contains(rec.stmts[0], "ReplicatedReplacingMergeTree('/ch/t/{shard}/{database}/schema_migrations'") {
		t.Fatalf("schema_migrations not replicated on the cluster:\n%s", rec.stmts[0])
	}
	for _, s := range rec.stmts {
		if strings.HasPrefix(s, "CREATE TABLE") && !strings.Contains(s, "ON CLUSTER") {
			t.Errorf("ran a table without ON CLUSTER:\n%s", s)
		}
	}
}

// recordingStore takes statements without running them.
type recordingStore struct{ stmts []string }

func (r *recordingStore) Exec(_ context.Context, sql string) error {
	r.stmts = append(r.stmts, sql)
	return nil
}
func (r *recordingStore) Insert(context.Context, string, []clickhouse.Column, *clickhouse.RowWriter) error {
	return nil
}
func (r *recordingStore) QueryStrings(context.Context, string) ([][]string, error) { return nil, nil }
func (r *recordingStore) Close() error                                             { return nil }
