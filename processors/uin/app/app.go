// Package app wires the uin recycling processors into one stack: the
// registration tracker, the recycle controller and the timer service that
// every delay of theirs goes through. `surge run` starts the same pieces
// one per process; tests and the bench start a whole stack in one.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"

	"surge/platform/supervise"
	"surge/processors/timer"
	"surge/processors/uin/account"
	"surge/processors/uin/allocation"
	"surge/processors/uin/pool"
	"surge/processors/uin/recycle"
	"surge/processors/uin/restore"
	"surge/processors/uin/tracker"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/streams"
	"surge/streams/metrics"
)

// Components of a stack; Options.Components picks some (default: the
// tracker, the controllers and the timers; the pool service only when
// named, since it serves an API).
const (
	Tracker = "tracker"
	Recycle = "recycle"
	Timers  = "timers"
	PoolAPI = "pool"
	Restore = "restore"
)

// Options configures a stack.
type Options struct {
	Namespace   string // topic, group and Redis key prefix
	Components  []string
	Pool        allocation.Config // the pool service's, when it runs here
	Dir         string            // local stores
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
	Kafka       streams.Cluster
	Accounts    *account.Store
	Pool        *pool.Central
	Tracker     *tracker.Tracker
	Controllers []*recycle.Controller
	Timers      *timer.Service
	PoolService *allocation.Service
	Restore     *restore.Service

	*supervise.Group // Stop, Wait, Err by component name

	mu  sync.Mutex // Controllers, gen
	gen int
}

// Topics lists the topics a stack uses.
func Topics(ns string) []schemas.Topic {
	return schemas.Namespaced(ns, schemas.TopicRegistrations, schemas.TopicUsage, schemas.TopicChecks, schemas.TopicTracking,
		schemas.TopicRecycleReqs, schemas.TopicRecycleSteps, schemas.TopicBackups, schemas.TopicDeletions,
		schemas.TopicRestoreReqs, schemas.TopicRestoreResults,
		schemas.TopicPool, schemas.TopicTimers, schemas.TopicDeadLetter)
}

// New builds a stack without starting it.
func New(kc streams.Cluster, rdb redis.UniversalClient, o Options) *Stack {
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
	if len(o.Components) == 0 {
		o.Components = []string{Tracker, Recycle, Timers}
	}
	if o.NoTracker {
		o.Components = slices.DeleteFunc(slices.Clone(o.Components), func(c string) bool { return c == Tracker })
	}
	central := pool.NewCentral(rdb, uinkeys.Pool(o.Namespace), o.Buckets)
	if len(kc.Seeds) > 0 {
		central.WithJournal(pool.NewKafkaJournal(kc, o.Namespace+schemas.TopicPool, o.Buckets))
	}
	return &Stack{Opts: o, Kafka: kc, Group: supervise.New(o.Log, "uin"),
		Accounts: account.NewStore(rdb, uinkeys.Prefix(o.Namespace)), Pool: central}
}

// CreateTopics creates the stack's topics.
func (s *Stack) CreateTopics(ctx context.Context, rep streams.Replication) error {
	return s.Kafka.EnsureTopics(ctx, rep, Topics(s.Opts.Namespace)...)
}

func (s *Stack) streamOpts(name string) []streams.Option {
	return append([]streams.Option{streams.Metrics(s.Opts.Metrics), streams.Logger(s.Opts.Log.With("processor", name))}, s.Opts.StreamOpts...)
}

// env is what the stack gives the processor called name.
func (s *Stack) env(name string) streams.Env {
	return streams.Env{Kafka: s.Kafka, Namespace: s.Opts.Namespace, Log: s.Opts.Log.With("processor", name), Metrics: s.Opts.Metrics}
}

// Start starts the tracker, the controllers and the timer service.
func (s *Stack) Start(ctx context.Context) {
	ns := s.Opts.Namespace
	tc := s.Opts.Tracker
	now := tc.Now
	tc.Env, tc.Dir = s.env("uin-tracker"), filepath.Join(s.Opts.Dir, "tracker")
	tc.Now = now
	s.Tracker = tracker.New(tc)
	if s.runs(Tracker) {
		s.Go(ctx, "tracker", func(ctx context.Context) error { return s.Tracker.Run(ctx, s.streamOpts("uin-tracker")...) })
	}
	if s.runs(Recycle) {
		for i := range s.Opts.Controllers {
			s.StartController(ctx, i)
		}
	}
	if s.runs(Timers) {
		s.Timers = timer.New(timer.Config{Env: s.env("uin-timers"), Dir: filepath.Join(s.Opts.Dir, "timers"),
			TransactionalID: ns + "surge-timer-uin", Targets: []string{ns + "uin."}})
		s.Go(ctx, "timers", s.Timers.Run)
	}
	if (s.runs(Recycle) || s.runs(Restore)) && !s.runs(PoolAPI) && len(s.Kafka.Seeds) > 0 {
		// They change the pool too: a pool Redis lost while no uin-pool
		// runs must be rebuilt before they go on (the pool service keeps
		// its own).
		keeper := s.Pool.NewKeeper(s.Kafka, ns+schemas.TopicPool, pool.RebuildOptions{Settle: s.Opts.Pool.RebuildSettle,
			Held: s.Accounts.ExistMany, Log: s.Opts.Log.With("processor", "uin-pool-keeper")})
		s.Go(ctx, "pool-keeper", keeper.Run)
	}
	if s.runs(PoolAPI) {
		pc := s.Opts.Pool
		pc.Env, pc.Central, pc.Accounts = s.env("uin-pool"), s.Pool, s.Accounts
		s.PoolService = allocation.New(pc)
		s.Go(ctx, "pool", func(ctx context.Context) error { return s.PoolService.Run(ctx, s.Opts.StreamOpts...) })
	}
	if s.runs(Restore) {
		s.Restore = restore.New(restore.Config{Env: s.env("uin-restore"), Accounts: s.Accounts, Pool: s.Pool})
		s.Go(ctx, "restore", func(ctx context.Context) error { return s.Restore.Run(ctx, s.streamOpts("uin-restore")...) })
	}
}

// EnsurePool returns once the central pool is in Redis, rebuilding it from
// uin.pool if it is not (a fresh namespace gets an empty pool): commands
// and tests that change the pool before any service runs call it.
func (s *Stack) EnsurePool(ctx context.Context) error {
	_, err := s.Pool.Rebuild(ctx, s.Kafka, s.Opts.Namespace+schemas.TopicPool, pool.RebuildOptions{
		Settle: s.Opts.Pool.RebuildSettle, Held: s.Accounts.ExistMany, Log: s.Opts.Log})
	return err
}

// RestoreTool restores accounts over the stack's stores and topics.
func (s *Stack) RestoreTool() *restore.Tool {
	return &restore.Tool{Kafka: s.Kafka, Namespace: s.Opts.Namespace, Accounts: s.Accounts, Pool: s.Pool}
}

func (s *Stack) runs(component string) bool { return slices.Contains(s.Opts.Components, component) }

// StartController starts (or brings back) recycle controller i.
func (s *Stack) StartController(ctx context.Context, i int) *recycle.Controller {
	s.mu.Lock()
	s.gen++ // a fresh store: the one it replaces may still be closing
	dir := filepath.Join(s.Opts.Dir, fmt.Sprintf("recycle-%d-%d", i, s.gen))
	s.mu.Unlock()
	c := recycle.New(recycle.Config{Env: s.env("uin-recycle"), Dir: dir,
		Accounts: s.Accounts, Pool: s.Pool, Policy: s.Opts.Policy})
	s.mu.Lock()
	for len(s.Controllers) <= i {
		s.Controllers = append(s.Controllers, nil)
	}
	s.Controllers[i] = c
	s.mu.Unlock()
	name := fmt.Sprintf("recycle-%d", i)
	opts := s.streamOpts("uin-recycle")
	if s.Opts.Controllers > 1 {
		// Several in one process: each its own instance (and transactional
		// id); a lone controller keeps the process's processor.instance_id.
		opts = append(opts, streams.InstanceID(name))
	}
	s.Go(ctx, name, func(ctx context.Context) error { return c.Run(ctx, opts...) })
	return c
}
