//go:build !nochdb

package clickhouse

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/chdb-io/chdb-go/chdb"
)

// ChDB is the embedded driver: the ClickHouse engine loaded from libchdb.so
// (scripts/chdb.sh installs it; CHDB_LIB_PATH points at it). chDB allows one
// session per process, so calls are serialised.
type ChDB struct {
	mu    sync.Mutex
	s     *chdb.Session
	spool string // where inserts stage their RowBinary file
}

// OpenChDB opens (or creates) a chDB database in dir; "" is a temporary one.
func OpenChDB(dir string) (*ChDB, error) {
	var (
		s   *chdb.Session
		err error
	)
	if dir == "" {
		s, err = chdb.NewSession()
	} else {
		s, err = chdb.NewSession(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("chdb: %w", err)
	}
	spool := os.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		spool = "/dev/shm" // memory: the file lives only for one insert
	}
	return &ChDB{s: s, spool: spool}, nil
}

func (c *ChDB) query(sql, format string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res, err := c.s.Query(sql, format)
	if err != nil {
		return "", err
	}
	defer res.Free()
	if err := res.Error(); err != nil {
		return "", err
	}
	return res.String(), nil
}

// Exec implements Store.
func (c *ChDB) Exec(_ context.Context, sql string) error {
	_, err := c.query(sql, "CSV")
	return err
}

// Insert implements Store: chDB has no way to pass data beside a query
// string, so the rows go through a file it reads with FROM INFILE.
func (c *ChDB) Insert(_ context.Context, table string, cols []Column, w *RowWriter) error {
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
	_, err = c.query(fmt.Sprintf("INSERT INTO %s (%s) FROM INFILE %s SETTINGS %s FORMAT RowBinary",
		table, names(cols), Quote(f.Name()), settingsClause(insertSettings)), "CSV")
	return err
}

// QueryStrings implements Store.
func (c *ChDB) QueryStrings(_ context.Context, sql string) ([][]string, error) {
	out, err := c.query(sql, "CSV")
	if err != nil {
		return nil, err
	}
	r := csv.NewReader(strings.NewReader(out))
	r.FieldsPerRecord = -1
	return r.ReadAll()
}

// Close implements Store. chDB keeps one session per process; Close ends it.
func (c *ChDB) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.Close()
	return nil
}
