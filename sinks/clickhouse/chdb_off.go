//go:build nochdb

package clickhouse

import (
	"context"
	"errors"
)

// ChDB is absent from this build (-tags nochdb, for server deployments that
// use a ClickHouse server and ship no libchdb.so).
type ChDB struct{}

// OpenChDB always fails in a nochdb build.
func OpenChDB(string, ...ChDBOption) (*ChDB, error) {
	return nil, errors.New("built with -tags nochdb: set clickhouse.dsn to a ClickHouse server")
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

// ChDBConnections is accepted and ignored in a nochdb build.
func ChDBConnections(int) ChDBOption { return func(*chdbConfig) {} }

// Connections is 0: there is no pool in a nochdb build.
func (*ChDB) Connections() int { return 0 }
