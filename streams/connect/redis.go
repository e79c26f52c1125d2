package connect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis modes: one server (or a proxy), a Redis Cluster (any node's address
// seeds it), or Sentinel-managed replication (the sentinels' addresses and
// redis.sentinel_master).
const (
	RedisSingle   = "single"
	RedisCluster  = "cluster"
	RedisSentinel = "sentinel"
)

// RedisOptions reads redis.mode, redis.username and redis.password (or
// _file: an ACL user, or the password alone for requirepass),
// redis.sentinel_master and redis.tls.* for a Redis at addrs (the
// comma-separated redis.addr, or another address such as the wallet's
// backup, which takes the same credentials).
func RedisOptions(get Getter, addrs []string) (*redis.UniversalOptions, error) {
	if len(addrs) == 0 {
		return nil, errors.New("no Redis address")
	}
	pass, err := Secret(get, "redis.password")
	if err != nil {
		return nil, err
	}
	tlsc, err := TLS(get, "redis")
	if err != nil {
		return nil, err
	}
	o := &redis.UniversalOptions{Addrs: addrs, Username: get("redis.username"), Password: pass, TLSConfig: tlsc}
	switch mode := strings.ToLower(strings.TrimSpace(get("redis.mode"))); mode {
	case "", RedisSingle:
		if len(addrs) > 1 {
			return nil, fmt.Errorf("redis.addr names %d servers but redis.mode is single (set cluster or sentinel)", len(addrs))
		}
	case RedisCluster:
		o.IsClusterMode = true
	case RedisSentinel:
		if o.MasterName = get("redis.sentinel_master"); o.MasterName == "" {
			return nil, errors.New("redis.mode sentinel needs redis.sentinel_master")
		}
		// Sentinels usually share the data nodes' credentials.
		o.SentinelUsername, o.SentinelPassword = o.Username, o.Password
	default:
		return nil, fmt.Errorf("redis.mode: %q is not single, cluster or sentinel", mode)
	}
	return o, nil
}

// Redis is a client of the configured Redis (redis.addr and the keys
// RedisOptions reads), checked as CheckRedis does.
func Redis(ctx context.Context, get Getter, timeout time.Duration) (redis.UniversalClient, error) {
	o, err := RedisOptions(get, List(get, "redis.addr"))
	if err != nil {
		return nil, err
	}
	rdb := redis.NewUniversalClient(o)
	if err := CheckRedis(ctx, rdb, timeout); err != nil {
		rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// CheckRedis pings rdb within timeout and says why it could not: a refused
// password is final at once; an unreachable server is retried until the
// timeout.
func CheckRedis(ctx context.Context, rdb redis.UniversalClient, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		msg := err.Error()
		switch {
		case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"), strings.Contains(msg, "NOPERM"):
			return &authError{err}
		case strings.Contains(msg, "certificate"):
			return fmt.Errorf("redis: TLS certificate not trusted (set redis.tls.ca_file): %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis: not reachable within %s: %w", timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// authError is a refused password or user: final, whatever the timeout.
type authError struct{ err error }

func (e *authError) Error() string {
	return "redis: authentication refused (check redis.username and its password): " + e.err.Error()
}
func (e *authError) Unwrap() error { return e.err }

// IsAuthError reports whether err is Redis refusing the credentials.
func IsAuthError(err error) bool {
	var a *authError
	return errors.As(err, &a)
}

// Scan lists the keys that match pattern on every node that holds keys:
// SCAN walks one server, so in a Redis Cluster it runs on each master.
func Scan(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	scan := func(ctx context.Context, c redis.Cmdable) ([]string, error) {
		var out []string
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			out = append(out, iter.Val())
		}
		return out, iter.Err()
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, rdb)
	}
	var mu sync.Mutex
	var all []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		keys, err := scan(ctx, node)
		mu.Lock()
		all = append(all, keys...)
		mu.Unlock()
		return err
	})
	return all, err
}
