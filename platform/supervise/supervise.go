// Package supervise runs the components of a stack (the push processors,
// the uin recycling processors) as named goroutines: each can be stopped
// on its own (a test's crash or drain, a restart under the same name), and
// the errors of those that stopped by themselves are collected.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// Group is a set of named components. The zero value is not usable; use New.
type Group struct {
	log  *slog.Logger
	what string

	mu    sync.Mutex
	wg    sync.WaitGroup
	stops map[string]context.CancelFunc
	errs  []error
}

// New returns a group whose failures are logged as what's.
func New(log *slog.Logger, what string) *Group {
	return &Group{log: log, what: what, stops: map[string]context.CancelFunc{}}
}

// Go runs fn as component name until ctx ends or Stop(name).
func (g *Group) Go(ctx context.Context, name string, fn func(context.Context) error) {
	cctx, cancel := context.WithCancel(ctx)
	g.mu.Lock()
	g.stops[name] = cancel
	g.mu.Unlock()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := fn(cctx); err != nil && cctx.Err() == nil {
			g.log.Error(g.what+": processor stopped", "processor", name, "err", err)
			g.mu.Lock()
			g.errs = append(g.errs, fmt.Errorf("%s: %w", name, err))
			g.mu.Unlock()
		}
	}()
}

// Stop stops one component gracefully.
func (g *Group) Stop(name string) {
	g.mu.Lock()
	stop := g.stops[name]
	g.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// Wait waits for every component to stop and returns their errors.
func (g *Group) Wait() error {
	g.wg.Wait()
	return g.Err()
}

// Err returns the errors of components that stopped on their own so far.
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return errors.Join(g.errs...)
}
