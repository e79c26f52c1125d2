//go:build chdb

package clickhouse

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"runtime"
	"strings"

	chdbpurego "github.com/chdb-io/chdb-go/chdb-purego"
)

// ChDB is the embedded driver: the ClickHouse engine loaded from libchdb.so
// (scripts/chdb.sh installs it; CHDB_LIB_PATH points at it).
//
// It holds a small pool of connections to one data directory. A
// connection runs one query at a time, and one insert keeps chDB's
// insert pipeline on about one core, so sinks inserting at once (several
// sinks in one process, or several tasks of one sink) each take their own
// connection and run in parallel (bench/sinks-notes.md).
type ChDB struct {
	conns   chan chdbpurego.ChdbConn
	all     []chdbpurego.ChdbConn
	dir     string
	tempDir bool   // dir was created by OpenChDB and goes with Close
	spool   string // where inserts stage their RowBinary file
}

// ChDBOption configures OpenChDB.
type ChDBOption func(*chdbConfig)

type chdbConfig struct{ conns int }

// ChDBConnections sets how many queries may run at once (default: the
// number of CPUs, at most 8).
func ChDBConnections(n int) ChDBOption {
	return func(c *chdbConfig) { c.conns = max(n, 1) }
}

// OpenChDB opens (or creates) a chDB database in dir; "" is a temporary one,
// removed by Close. chDB serves one data directory per process.
func OpenChDB(dir string, opts ...ChDBOption) (*ChDB, error) {
	cfg := chdbConfig{conns: min(runtime.GOMAXPROCS(0), 8)}
	for _, o := range opts {
		o(&cfg)
	}
	c := &ChDB{dir: dir, spool: os.TempDir()}
	if dir == "" {
		d, err := os.MkdirTemp("", "chdb_")
		if err != nil {
			return nil, fmt.Errorf("chdb: %w", err)
		}
		c.dir, c.tempDir = d, true
	}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		c.spool = "/dev/shm" // memory: the file lives only for one insert
	}
	c.conns = make(chan chdbpurego.ChdbConn, cfg.conns)
	for range cfg.conns {
		conn, err := chdbpurego.NewConnectionFromConnString(c.dir)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("chdb: %w", err)
		}
		c.all = append(c.all, conn)
		c.conns <- conn
	}
	return c, nil
}

// Connections is the size of the pool: how many queries run at once.
func (c *ChDB) Connections() int { return len(c.all) }

func (c *ChDB) query(ctx context.Context, sql, format string) (string, error) {
	var conn chdbpurego.ChdbConn
	select {
	case conn = <-c.conns:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { c.conns <- conn }()
	res, err := conn.Query(sql, format)
	if err != nil {
		return "", err
	}
	if res == nil {
		return "", nil
	}
	defer res.Free()
	if err := res.Error(); err != nil {
		return "", err
	}
	return res.String(), nil
}

// Query runs sql and returns its whole output in the named ClickHouse
// format ("JSONCompactStrings", "Native", ...), for callers that need a
// format the Store methods do not give (chdbhttp reads results as
// JSONCompactStrings, with their column types).
func (c *ChDB) Query(ctx context.Context, sql, format string) (string, error) {
	return c.query(ctx, sql, format)
}

// Exec implements Store.
func (c *ChDB) Exec(ctx context.Context, sql string) error {
	_, err := c.query(ctx, sql, "CSV")
	return err
}

// Insert implements Store: chDB has no way to pass data beside a query
// string, so the rows go through a file it reads with FROM INFILE.
func (c *ChDB) Insert(ctx context.Context, table string, cols []Column, w *RowWriter) error {
	if w.Rows() == 0 {
		return nil
	}
	f, err := os.CreateTemp(c.spool, "surge-insert-*.rowbinary")
	if err != nil {
		return fmt.Errorf("chdb: insert spool: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(w.Bytes())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("chdb: insert spool: %w", err)
	}
	_, err = c.query(ctx, fmt.Sprintf("INSERT INTO %s (%s) FROM INFILE %s SETTINGS %s FORMAT RowBinary",
		table, names(cols), Quote(f.Name()), settingsClause(insertSettings)), "CSV")
	return err
}

// QueryStrings implements Store.
func (c *ChDB) QueryStrings(ctx context.Context, sql string) ([][]string, error) {
	out, err := c.query(ctx, sql, "CSV")
	if err != nil {
		return nil, err
	}
	r := csv.NewReader(strings.NewReader(out))
	r.FieldsPerRecord = -1
	return r.ReadAll()
}

// Close implements Store: it waits for queries in flight, closes every
// connection (the last one stops the engine) and removes a temporary
// directory.
func (c *ChDB) Close() error {
	for range c.all {
		<-c.conns
	}
	for _, conn := range c.all {
		conn.Close()
	}
	c.all = nil
	if c.tempDir {
		return os.RemoveAll(c.dir)
	}
	return nil
}
