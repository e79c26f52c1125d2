// Package health is what a scheduler asks a service: is it alive
// (/healthz: the process answers) and is it ready (/readyz: it has joined
// its groups and restored its state, and its brokers, Redis and ClickHouse
// answer). Components add their own checks; the handler runs them all.
package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Checks is a set of named readiness checks.
type Checks struct {
	mu     sync.Mutex
	seq    int
	checks map[int]named // by the id Add gave, so two of one name both count
}

type named struct {
	name  string
	check func(context.Context) error
}

// Default is the process's checks, served by the metrics endpoint.
var Default = &Checks{}

// Add adds a check called name; remove takes it out.
func (c *Checks) Add(name string, check func(context.Context) error) (remove func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.checks == nil {
		c.checks = map[int]named{}
	}
	c.seq++
	id := c.seq
	c.checks[id] = named{name, check}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.checks, id)
	}
}

// Flag is a check that fails with why until it is set.
type Flag struct {
	mu  sync.Mutex
	ok  bool
	why string
}

// NewFlag returns a flag that is not set, failing with why.
func NewFlag(why string) *Flag { return &Flag{why: why} }

// Set marks the component ready (true) or not, saying why not.
func (f *Flag) Set(ok bool, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ok, f.why = ok, why
}

// Check is the flag as a check.
func (f *Flag) Check(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ok {
		return nil
	}
	return errors.New(f.why)
}

// Check runs every check (at once, each within timeout) and returns the
// failures by name.
func (c *Checks) Check(ctx context.Context, timeout time.Duration) map[string]error {
	c.mu.Lock()
	checks := make([]named, 0, len(c.checks))
	for _, n := range c.checks {
		checks = append(checks, n)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		mu     sync.Mutex
		failed = map[string]error{}
		wg     sync.WaitGroup
	)
	for _, n := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.check(ctx); err != nil {
				mu.Lock()
				failed[n.name] = errors.Join(failed[n.name], err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

// Handler answers 200 "ready" when every check passes, else 503 with a
// line per failing check.
func (c *Checks) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		failed := c.Check(r.Context(), 2*time.Second)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if len(failed) == 0 {
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		names := make([]string, 0, len(failed))
		for n := range failed {
			names = append(names, n)
		}
		sort.Strings(names)
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, "%s: %v\n", n, failed[n])
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(b.String()))
	})
}
