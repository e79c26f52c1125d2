package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/viper"

	"surge/processors/push/presence"
	"surge/sinks/clickhouse"
	"surge/streams"
	"surge/streams/connect"
)

// pipeline is the set of processors and sinks that run together.
type pipeline struct {
	presence *presence.Processor
	wg       sync.WaitGroup
	mu       sync.Mutex
	errs     []error
}

// components are the names `surge run` accepts: every processor and
// every fact sink. "wallet" is wallet-api with the wallet-ledger whose
// partitions' reads it answers (and wallet-identities beside them).
var components = func() []string {
	names := []string{"presence", "push-presence", "push-planner", "push-executor", "push-offline", "push-timers", "push-ctr",
		"uin-tracker", "uin-recycle", "uin-timers", "uin-pool", "uin-restore", "wallet", "wallet-identities"}
	for _, f := range clickhouse.Facts() {
		names = append(names, f.Name)
	}
	return names
}()

// defaultComponents are what `embedded` starts.
var defaultComponents = []string{"presence", "sink-dead-letters", "sink-presence"}

// start runs the named components (all when names is empty) until ctx ends.
// store may be nil when no sink is named.
// Each sink runs sinkTasks tasks.
func startPipeline(ctx context.Context, log *slog.Logger, kc streams.Cluster, store clickhouse.Store, mirror *presence.RedisMirror, names []string, sinkTasks int, opts map[string][]streams.Option) (*pipeline, error) {
	if len(names) == 0 {
		names = defaultComponents
	}
	// Every sink's table is checked before anything starts.
	var sinks []*clickhouse.Sink
	for _, f := range clickhouse.Facts() {
		if slices.Contains(names, f.Name) {
			sinks = append(sinks, f)
		}
	}
	if len(sinks) > 0 && store != nil {
		if err := clickhouse.CheckTables(ctx, store, sinks...); err != nil {
			return nil, err
		}
	}
	p := &pipeline{}
	for _, name := range names {
		var run func(context.Context) error
		o := opts[name]
		switch name {
		case "presence":
			p.presence = presence.New(presence.Config{Env: streams.Env{Kafka: kc, Log: log}})
			if mirror != nil {
				p.presence.WithMirror(ctx, mirror)
			}
			run = func(ctx context.Context) error { return p.presence.Run(ctx, o...) }
		default:
			var s *clickhouse.Sink
			for _, f := range clickhouse.Facts() {
				if f.Name == name {
					s = f
				}
			}
			if s == nil {
				return nil, fmt.Errorf("unknown component %q (have %v)", name, components)
			}
			if store == nil {
				return nil, fmt.Errorf("%s needs ClickHouse", name)
			}
			s.Bind(store)
			run = func(ctx context.Context) error { return s.RunTasks(ctx, kc, sinkTasks, o...) }
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			log.Info("component started", "name", name)
			if err := run(ctx); err != nil {
				p.mu.Lock()
				p.errs = append(p.errs, fmt.Errorf("%s: %w", name, err))
				p.mu.Unlock()
			}
		}()
	}
	return p, nil
}

// wait blocks until every component stopped and returns their errors.
func (p *pipeline) wait() error {
	p.wg.Wait()
	if len(p.errs) > 0 {
		return fmt.Errorf("%v", p.errs)
	}
	return nil
}

// openMirror connects the online-bitmap mirror to rdb, or returns nil
// for no Redis. An unreachable Redis only delays the mirror, which catches
// up when it answers.
// A refused password is a mistake to stop on.
func openMirror(ctx context.Context, rdb redis.UniversalClient, prefix string, log *slog.Logger) (*presence.RedisMirror, error) {
	if rdb == nil {
		return nil, nil
	}
	if err := connect.CheckRedis(ctx, rdb, 2*time.Second); err != nil {
		if connect.IsAuthError(err) {
			return nil, err
		}
		log.Warn("redis not reachable at start; the online mirror catches up when it is", "err", err)
	}
	return presence.NewRedisMirror(rdb, prefix, nil, log), nil
}

// openStore connects the ClickHouse server at clickhouse.dsn, or opens chDB.
func openStore(ctx context.Context, v *viper.Viper, log *slog.Logger) (clickhouse.Store, error) {
	dsn, chdbDir := v.GetString("clickhouse.dsn"), v.GetString("clickhouse.chdb_dir")
	var (
		st  clickhouse.Store
		err error
	)
	if dsn != "" {
		var a clickhouse.ServerAuth
		if a, err = clickhouseAuth(v); err != nil {
			return nil, err
		}
		st, err = clickhouse.OpenServerWith(ctx, dsn, a)
	} else {
		var opts []clickhouse.ChDBOption
		if n := v.GetInt("clickhouse.chdb_connections"); n > 0 {
			opts = append(opts, clickhouse.ChDBConnections(n))
		}
		st, err = clickhouse.OpenChDB(chdbDir, opts...)
	}
	if err != nil {
		return nil, err
	}
	applied, err := clickhouse.MigrateCluster(ctx, st, clickhouse.Cluster{
		Name: v.GetString("clickhouse.cluster"), ZooPath: v.GetString("clickhouse.replication_path")})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	log.Info("clickhouse ready", "server", dsn != "", "migrations_applied", applied)
	return st, nil
}

// clickhouseAuth is clickhouse.username, clickhouse.password (or _file)
// and clickhouse.tls.*, which win over the DSN's own.
func clickhouseAuth(v *viper.Viper) (clickhouse.ServerAuth, error) {
	pass, err := connect.Secret(v.GetString, "clickhouse.password")
	if err != nil {
		return clickhouse.ServerAuth{}, err
	}
	tlsc, err := connect.TLS(v.GetString, "clickhouse")
	if err != nil {
		return clickhouse.ServerAuth{}, err
	}
	return clickhouse.ServerAuth{Username: v.GetString("clickhouse.username"), Password: pass, TLS: tlsc}, nil
}
