package embedded

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
)

// Redis is an in-process Redis-compatible server (miniredis).
type Redis struct{ m *miniredis.Miniredis }

// StartRedis starts it on a free loopback port.
func StartRedis() (*Redis, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("embedded redis: %w", err)
	}
	return &Redis{m: m}, nil
}

// Addr is host:port.
func (r *Redis) Addr() string { return r.m.Addr() }

// Close stops it; its data is gone.
func (r *Redis) Close() { r.m.Close() }
