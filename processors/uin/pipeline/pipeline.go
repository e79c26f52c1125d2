// Package pipeline wires the uin recycling processors into one stack: the
// registration tracker, the recycle controller and the timer service that
// every delay of theirs goes through. `surge run` starts the same pieces
// one per process; tests and the bench start a whole stack in one.
package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/supervise"
	"surge/processors/timer"
	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/processors/uin/recycle"
	"surge/processors/uin/tracker"
	"surge/schemas"
	"surge/streams"
	"surge/streams/metrics"
)

// Options configures a stack.
type Options struct {
	Namespace   string // topic, group and Redis key prefix
	Dir         string // local stores
	Tracker     tracker.Config
	Policy      recycle.Policy
	Buckets     int  // central pool buckets (seed: 1,000)
	Controllers int  // recycle controller instances (default 1; -1: none, they run elsewhere)
	NoTracker   bool // stock-only runs: accounts past the registration checks
	StreamOpts  []streams.Option
	Log         *slog.Logger
	Metrics     *metrics.Registry
}

// Stack is one running recycling stack.
type Stack struct {
	Opts        Options
	Brokers     []string
	Accounts    *account.Store
	Pool        *pool.Central
	Tracker     *tracker.Tracker
	Controllers []*recycle.Controller
	Timers      *timer.Service

	*supervise.Group // Stop, Wait, Err by component name

	mu  sync.Mutex // Controllers, gen
	gen int
}

// Topics lists the topics a stack uses.
func Topics(ns string) []schemas.Topic {
	return schemas.Namespaced(ns, schemas.TopicRegistrations, schemas.TopicUsage, schemas.TopicChecks, schemas.TopicTracking,
		schemas.TopicRecycleReqs, schemas.TopicRecycleSteps, schemas.TopicBackups, schemas.TopicDeletions,
		schemas.TopicPool, schemas.TopicTimers, schemas.TopicDeadLetter)
}

// New builds a stack without starting it.
func New(brokers []string, rdb redis.UniversalClient, o Options) *Stack {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.NewRegistry()
	}
	if o.Buckets == 0 {
		o.Buckets = 1000
	}
	if o.Controllers == 0 {
		o.Controllers = 1
	}
	o.Controllers = max(o.Controllers, 0)
	return &Stack{Opts: o, Brokers: brokers, Group: supervise.New(o.Log, "uin"),
		Accounts: account.NewStore(rdb, o.Namespace), Pool: pool.NewCentral(rdb, o.Namespace+"pool:", o.Buckets)}
}

// CreateTopics creates the stack's topics.
func (s *Stack) CreateTopics(ctx context.Context, replication int16) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	return streams.EnsureTopics(ctx, cl, replication, Topics(s.Opts.Namespace)...)
}

func (s *Stack) streamOpts(name string) []streams.Option {
	return append([]streams.Option{streams.Metrics(s.Opts.Metrics), streams.Logger(s.Opts.Log.With("processor", name))}, s.Opts.StreamOpts...)
}

// Start starts the tracker, the controllers and the timer service.
func (s *Stack) Start(ctx context.Context) {
	ns := s.Opts.Namespace
	tc := s.Opts.Tracker
	tc.Namespace, tc.Dir, tc.Log, tc.Metrics = ns, filepath.Join(s.Opts.Dir, "tracker"), s.Opts.Log, s.Opts.Metrics
	s.Tracker = tracker.New(tc, s.Brokers)
	if !s.Opts.NoTracker {
		s.Go(ctx, "tracker", func(ctx context.Context) error { return s.Tracker.Run(ctx, s.streamOpts("uin-tracker")...) })
	}
	for i := range s.Opts.Controllers {
		s.StartController(ctx, i)
	}
	s.Timers = timer.New(s.Brokers, timer.Topic(ns+schemas.TopicTimers), timer.Dir(filepath.Join(s.Opts.Dir, "timers")),
		timer.TransactionalID(ns+"surge-timer"), timer.Logger(s.Opts.Log), timer.Metrics(s.Opts.Metrics))
	s.Go(ctx, "timers", s.Timers.Run)
}

// StartController starts (or brings back) recycle controller i.
func (s *Stack) StartController(ctx context.Context, i int) *recycle.Controller {
	s.mu.Lock()
	s.gen++ // a fresh store: the one it replaces may still be closing
	dir := filepath.Join(s.Opts.Dir, fmt.Sprintf("recycle-%d-%d", i, s.gen))
	s.mu.Unlock()
	c := recycle.New(recycle.Config{Namespace: s.Opts.Namespace, Dir: dir,
		Accounts: s.Accounts, Pool: s.Pool, Policy: s.Opts.Policy, Log: s.Opts.Log, Metrics: s.Opts.Metrics}, s.Brokers)
	s.mu.Lock()
	for len(s.Controllers) <= i {
		s.Controllers = append(s.Controllers, nil)
	}
	s.Controllers[i] = c
	s.mu.Unlock()
	name := fmt.Sprintf("recycle-%d", i)
	s.Go(ctx, name, func(ctx context.Context) error {
		return c.Run(ctx, append(s.streamOpts("uin-recycle"), streams.InstanceID(name))...)
	})
	return c
}
