//go:build !chdb

package clickhouse

import (
	"context"
	"errors"
)

// ChDB is absent from this build. chdb-go loads libchdb.so when the
// program starts and panics without it, so it is opt-in (-tags chdb):
// a plain `go build ./cmd/surge` runs every command that needs no
// embedded ClickHouse on a machine without the library.
type ChDB struct{}

// ErrNoChDB says how to get the embedded ClickHouse.
var ErrNoChDB = errors.New("this surge was built without chDB, the embedded ClickHouse: set clickhouse.dsn to a ClickHouse server, " +
	"or build with -tags chdb (scripts/chdb.sh installs libchdb.so; scripts/embedded.sh does both)")

// OpenChDB always fails in a build without chDB.
func OpenChDB(string, ...ChDBOption) (*ChDB, error) {
	return nil, ErrNoChDB
}

func (*ChDB) Exec(context.Context, string) error { return errors.ErrUnsupported }
func (*ChDB) Query(context.Context, string, string) (string, error) {
	return "", errors.ErrUnsupported
}
func (*ChDB) QueryStrings(context.Context, string) ([][]string, error) {
	return nil, errors.ErrUnsupported
}
func (*ChDB) Insert(context.Context, string, []Column, *RowWriter) error {
	return errors.ErrUnsupported
}
func (*ChDB) Close() error { return nil }

// ChDBOption configures OpenChDB.
type ChDBOption func(*chdbConfig)

type chdbConfig struct{}

// ChDBConnections is accepted and ignored in a build without chDB.
func ChDBConnections(int) ChDBOption { return func(*chdbConfig) {} }

// Connections is 0: there is no pool in a build without chDB.
func (*ChDB) Connections() int { return 0 }
