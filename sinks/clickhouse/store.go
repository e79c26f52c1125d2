// Package clickhouse writes topic records into ClickHouse tables and reads
// them back for reconciliation. One code path serves two drivers: chDB (the
// ClickHouse engine in-process, for the embedded mode and the tests) and
// clickhouse-go v2 (a ClickHouse server). Both run the same DDL and SQL.
package clickhouse

import (
	"context"
	"embed"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Store is what sinks and reports need from ClickHouse.
type Store interface {
	// Exec runs a statement (DDL, or an INSERT with its data).
	Exec(ctx context.Context, sql string) error
	// Insert writes the rows of w (RowBinary, see RowWriter) into the
	// table's columns in one insert. Sinks write only through Insert.
	Insert(ctx context.Context, table string, cols []Column, w *RowWriter) error
	// QueryStrings runs a SELECT and returns each row as strings.
	QueryStrings(ctx context.Context, sql string) ([][]string, error)
	Close() error
}

// Both drivers serve the one code path.
var (
	_ Store = (*ChDB)(nil)
	_ Store = (*Server)(nil)
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrate applies, in order, every migration in migrations/ not yet
// recorded in schema_migrations. Each file is one statement; a file that
// fails stops the migration and is reported with its name.
func Migrate(ctx context.Context, s Store) ([]string, error) {
	return MigrateCluster(ctx, s, Cluster{})
}

// MigrateCluster is Migrate on the ClickHouse cluster c (nothing but
// Migrate when c has no name): each migration runs in its cluster form
// (Cluster.Rewrite), and schema_migrations is replicated too.
func MigrateCluster(ctx context.Context, s Store, c Cluster) ([]string, error) {
	ledger := `CREATE TABLE IF NOT EXISTS schema_migrations (
		version UInt32, name String, applied_at DateTime DEFAULT now()
	) ENGINE = MergeTree ORDER BY version`
	if c.Name != "" {
		ledger = fmt.Sprintf(`CREATE TABLE IF NOT EXISTS schema_migrations ON CLUSTER %s (
		version UInt32, name String, applied_at DateTime DEFAULT now()
	) ENGINE = ReplicatedReplacingMergeTree('%s/{shard}/{database}/schema_migrations', '{replica}') ORDER BY version`,
			quoteIdent(c.Name), strings.TrimRight(c.zooPath(), "/"))
	}
	if err := s.Exec(ctx, ledger); err != nil {
		return nil, fmt.Errorf("clickhouse: schema_migrations: %w", err)
	}
	rows, err := s.QueryStrings(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, err
	}
	applied := map[int]bool{}
	for _, r := range rows {
		v, _ := strconv.Atoi(r[0])
		applied[v] = true
	}
	entries, err := migrationFiles.ReadDir("migrations")
	if err != nil {
		return nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	var did []string
	for _, e := range entries {
		name := e.Name()
		v, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return did, fmt.Errorf("clickhouse: migration %s: name must start with a number", name)
		}
		if applied[v] {
			continue
		}
		body, _ := migrationFiles.ReadFile("migrations/" + name)
		stmts := []string{string(body)}
		if c.Name != "" {
			if stmts, err = c.Rewrite(string(body)); err != nil {
				return did, fmt.Errorf("clickhouse: migration %s: %w", name, err)
			}
		}
		for _, stmt := range stmts {
			if err := s.Exec(ctx, stmt); err != nil {
				return did, fmt.Errorf("clickhouse: migration %s: %w", name, err)
			}
		}
		if err := s.Exec(ctx, fmt.Sprintf("INSERT INTO schema_migrations (version, name) VALUES (%d, %s)", v, Quote(name))); err != nil {
			return did, err
		}
		did = append(did, name)
	}
	return did, nil
}

// insertSettings apply to every sink insert, on both drivers.
// optimize_on_insert=0 skips collapsing equal keys inside each inserted
// block: background merges and FINAL (or the idempotent folds of
// wallet_orders) collapse them anyway, and skipping it halves chDB's
// insert cost (bench/sinks-notes.md).
var insertSettings = map[string]int{"optimize_on_insert": 0}

// settingsClause renders settings for a SETTINGS clause.
func settingsClause(settings map[string]int) string {
	parts := make([]string, 0, len(settings))
	for k, v := range settings {
		parts = append(parts, fmt.Sprintf("%s = %d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// Quote renders s as a ClickHouse string literal.
func Quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		case 0:
			b.WriteString(`\0`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
