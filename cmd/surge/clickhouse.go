package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"surge/sinks/clickhouse"
	"surge/sinks/clickhouse/chdbhttp"
	"surge/streams/connect"
)

const clickhouseUsage = `usage: surge clickhouse serve [flags]

Serves the embedded ClickHouse (chDB, in clickhouse.chdb_dir) over
ClickHouse's HTTP interface at clickhouse.serve_addr, so the sinks, surge uin
classify and surge recon run as separate processes on one chDB database
without a ClickHouse server: give them clickhouse.dsn http://ADDR/default
and the same clickhouse.username and clickhouse.password. chDB locks its
directory, so this is the one process that opens it. Callers authenticate
as clickhouse.username (default "default") with clickhouse.password; on an
address other than loopback a password is required.
`

// cmdClickhouse runs the embedded ClickHouse's server.
func cmdClickhouse(ctx context.Context, args []string) error {
	v, fs, err := loadConfig("clickhouse", args, nil)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 || fs.Arg(0) != "serve" {
		fmt.Fprint(os.Stderr, clickhouseUsage)
		return errors.New("clickhouse takes one action: serve")
	}
	if v.GetString("clickhouse.dsn") != "" {
		return errors.New("clickhouse serve serves the embedded chDB; clickhouse.dsn names a server to use instead")
	}
	log := newLogger(v)
	addr := v.GetString("clickhouse.serve_addr")
	user := v.GetString("clickhouse.username")
	if user == "" {
		user = "default"
	}
	pass, err := connect.Secret(v.GetString, "clickhouse.password")
	if err != nil {
		return err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("clickhouse.serve_addr %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); pass == "" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("clickhouse.serve_addr %s is not loopback: set clickhouse.password (or clickhouse.password_file) for the callers", addr)
	}
	var opts []clickhouse.ChDBOption
	if n := v.GetInt("clickhouse.chdb_connections"); n > 0 {
		opts = append(opts, clickhouse.ChDBConnections(n))
	}
	db, err := clickhouse.OpenChDB(v.GetString("clickhouse.chdb_dir"), opts...)
	if err != nil {
		return err
	}
	defer db.Close()
	applied, err := clickhouse.Migrate(ctx, db)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("clickhouse serve: %w", err)
	}
	if err := serveMetrics(ctx, v, log); err != nil {
		return err
	}
	srv := &http.Server{Handler: chdbhttp.RequireUser(user, pass, chdbhttp.New(db)), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("clickhouse: serving the embedded chDB over ClickHouse's HTTP interface", "dsn", "http://"+ln.Addr().String()+"/default",
		"user", user, "dir", v.GetString("clickhouse.chdb_dir"), "migrations_applied", applied)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
