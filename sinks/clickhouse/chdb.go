//go:build !nochdb

package clickhouse

import (
	"context"
	"encoding/csv"
	"fmt"
	"strings"
	"sync"

	"github.com/chdb-io/chdb-go/chdb"
)

// ChDB is the embedded driver: the ClickHouse engine loaded from libchdb.so
// (scripts/chdb.sh installs it; CHDB_LIB_PATH points at it). chDB allows one
// session per process, so calls are serialised.
type ChDB struct {
	mu sync.Mutex
	s  *chdb.Session
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
	return &ChDB{s: s}, nil
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
