package clickhouse

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Server is the driver for a ClickHouse server, over clickhouse-go v2.
type Server struct{ conn driver.Conn }

// OpenServer connects with a DSN such as clickhouse://127.0.0.1:9000/default
// (clickhouse://user:password@host:9440/db?secure=true for a secured one).
func OpenServer(ctx context.Context, dsn string) (*Server, error) {
	return OpenServerWith(ctx, dsn, ServerAuth{})
}

// ServerAuth is what a deployment adds to the DSN so that no secret has
// to sit in it: a user and password, and TLS. What is set wins over the
// DSN's own.
type ServerAuth struct {
	Username, Password string
	TLS                *tls.Config
}

// OpenServerWith is OpenServer with a's credentials and TLS.
func OpenServerWith(ctx context.Context, dsn string, a ServerAuth) (*Server, error) {
	opts, err := ch.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: dsn: %w", err)
	}
	if a.Username != "" {
		opts.Auth.Username = a.Username
	}
	if a.Password != "" {
		opts.Auth.Password = a.Password
	}
	if a.TLS != nil {
		opts.TLS = a.TLS
	}
	conn, err := ch.Open(opts)
	if err != nil {
		return nil, err
	}
	if err := conn.Ping(ctx); err != nil {
		_ = conn.Close()
		var ex *ch.Exception
		if errors.As(err, &ex) && ex.Code == 516 { // AUTHENTICATION_FAILED
			return nil, fmt.Errorf("clickhouse %s: authentication refused (check clickhouse.username and its password): %w", opts.Addr, err)
		}
		return nil, fmt.Errorf("clickhouse: ping %s: %w", opts.Addr, err)
	}
	return &Server{conn: conn}, nil
}

// Exec implements Store.
func (s *Server) Exec(ctx context.Context, sql string) error { return s.conn.Exec(ctx, sql) }

// Insert implements Store with a columnar batch: the RowBinary rows are
// decoded into one slice per column and appended column by column.
func (s *Server) Insert(ctx context.Context, table string, cols []Column, w *RowWriter) error {
	if w.Rows() == 0 {
		return nil
	}
	data, err := DecodeColumns(cols, w.Rows(), w.Bytes())
	if err != nil {
		return err
	}
	settings := ch.Settings{}
	for k, v := range insertSettings {
		settings[k] = v
	}
	ctx = ch.Context(ctx, ch.WithSettings(settings))
	batch, err := s.conn.PrepareBatch(ctx, fmt.Sprintf("INSERT INTO %s (%s)", table, names(cols)))
	if err != nil {
		return err
	}
	for i := range cols {
		if err := batch.Column(i).Append(data[i]); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("clickhouse: %s.%s: %w", table, cols[i].Name, err)
		}
	}
	return batch.Send()
}

// QueryStrings implements Store; every column is read as its text form.
func (s *Server) QueryStrings(ctx context.Context, sql string) ([][]string, error) {
	rows, err := s.conn.Query(ctx, "SELECT * APPLY(toString) FROM ("+sql+")")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	n := len(rows.Columns())
	var out [][]string
	for rows.Next() {
		row := make([]string, n)
		ptrs := make([]any, n)
		for i := range row {
			ptrs[i] = &row[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// Close implements Store.
func (s *Server) Close() error { return s.conn.Close() }
