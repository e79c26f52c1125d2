// Package app wires the mass-push processors over one set of topics
// (optionally namespaced): presence, the planner, executors, the offline
// queues, the timers and push-ctr. `surge run push-*` starts one component
// of it per process; `surge loadgen`, the tests and the benchmarks start
// several in one. Every input comes from a topic: the follower lists,
// accounts, tags and blacklists are the planner's directory, materialised
// from the topics other teams publish to (push.fan-delta, push.accounts,
// push.tags, push.blacklists).
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/platform/supervise"
	"surge/processors/push/ctr"
	"surge/processors/push/directory"
	"surge/processors/push/executor"
	"surge/processors/push/numpkg"
	"surge/processors/push/offline"
	"surge/processors/push/planner"
	"surge/processors/push/presence"
	"surge/processors/timer"
	"surge/schemas"
	"surge/streams"
	"surge/streams/metrics"
)

// Components of a stack; Options.Components picks some (default: all).
const (
	Presence = "presence"
	Planner  = "planner"
	Executor = "executor"
	Offline  = "offline"
	Timers   = "timers"
	CTR      = "ctr"
)

// Options configure a stack.
type Options struct {
	Namespace string
	// Replication of the topics created as the stack runs (executors'
	// unit queues); zero takes it from the cluster.
	Replication streams.Replication
	Dir         string   // Pebble stores (package cache, offline queues, timers) live under it
	Components  []string // which to run here; empty: all
	// Executors is how many executors run here (named exec-0...), unless
	// ExecutorNames names them.
	Executors     int
	ExecutorNames []string
	// ExecutorCapacity is the uins an executor here takes at once (it
	// reports it; the planner keeps its units in flight within it); 0:
	// only the planner's push.max_backlog limits it.
	ExecutorCapacity uint64
	Planner          planner.Config
	MirrorThreshold  uint64 // accounts with this many fans use the mirror
	Log              *slog.Logger
	Metrics          *metrics.Registry
	StreamOpts       []streams.Option // extra runtime options for every processor
}

// Stack is a running push pipeline.
type Stack struct {
	Opts      Options
	Kafka     streams.Cluster
	Directory *directory.Directory
	Packages  *numpkg.TopicStore // opened by Start when the planner runs here
	Presence  *presence.Processor
	Planner   *planner.Planner
	Executors []*executor.Executor
	Offline   *offline.Queues
	Timers    *timer.Service
	CTR       *ctr.Processor

	*supervise.Group // Stop, Wait, Err by component name

	mu sync.Mutex // Executors
}

// Topics lists the topics a stack uses, with their registry contracts.
func Topics(ns string) []schemas.Topic {
	var out []schemas.Topic
	for _, name := range []string{schemas.TopicLogin, schemas.TopicPresence, schemas.TopicFanDelta, schemas.TopicJobs,
		schemas.TopicJobCommands, schemas.TopicJobTransitions, schemas.TopicPlannerCkpt, schemas.TopicReports, schemas.TopicExecutors, schemas.TopicExecCommands, schemas.TopicOffline,
		schemas.TopicAccounts, schemas.TopicTags, schemas.TopicBlacklists, schemas.TopicPackages,
		schemas.TopicClicks, schemas.TopicJobClicks, schemas.TopicTimers, schemas.TopicDeadLetter} {
		t, _ := schemas.TopicByName(name)
		t.Name = ns + name
		out = append(out, t)
	}
	return out
}

// New builds a stack without starting it.
func New(kc streams.Cluster, o Options) *Stack {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.NewRegistry()
	}
	if o.Executors == 0 {
		o.Executors = 2
	}
	if o.Planner.UnitSize == 0 {
		o.Planner = planner.DefaultConfig()
	}
	if o.MirrorThreshold == 0 {
		o.MirrorThreshold = 10_000_000 // the seed's threshold
	}
	if len(o.Components) == 0 {
		o.Components = []string{Presence, Planner, Executor, Offline, Timers, CTR}
	}
	if len(o.ExecutorNames) == 0 {
		for i := range o.Executors {
			o.ExecutorNames = append(o.ExecutorNames, fmt.Sprintf("exec-%d", i))
		}
	}
	return &Stack{Opts: o, Kafka: kc, Directory: directory.New(o.Namespace), Group: supervise.New(o.Log, "push")}
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
	return streams.Env{Kafka: s.Kafka, Namespace: s.Opts.Namespace, Replication: s.Opts.Replication,
		Log: s.Opts.Log.With("processor", name), Metrics: s.Opts.Metrics}
}

func (s *Stack) runs(component string) bool { return slices.Contains(s.Opts.Components, component) }

// Start starts the stack's components.
func (s *Stack) Start(ctx context.Context) error {
	ns := s.Opts.Namespace
	if s.runs(Presence) {
		s.Presence = presence.New(presence.Config{Env: s.env("presence")})
		s.Go(ctx, "presence", func(ctx context.Context) error {
			return s.Presence.Run(ctx, append(s.streamOpts("presence"),
				streams.DeadLetterTopic(ns+schemas.TopicDeadLetter))...)
		})
	}
	if s.runs(Planner) {
		pkgs, err := numpkg.OpenTopicStore(ctx, s.Kafka, ns+schemas.TopicPackages, filepath.Join(s.Opts.Dir, "packages"), s.Opts.Log)
		if err != nil {
			return fmt.Errorf("push: package store: %w", err)
		}
		s.Packages = pkgs
		cfg := s.Opts.Planner
		cfg.Env, cfg.Packages, cfg.Directory, cfg.MirrorThreshold = s.env("planner"), pkgs, s.Directory, s.Opts.MirrorThreshold
		if s.Opts.Planner.Now != nil {
			cfg.Now = s.Opts.Planner.Now
		}
		s.Planner = planner.New(cfg)
		s.Go(ctx, "planner", func(ctx context.Context) error {
			defer pkgs.Close()
			return s.Planner.Run(ctx, s.streamOpts("planner")...)
		})
	}
	if s.runs(Offline) {
		s.Offline = offline.New(offline.Config{Env: s.env("offline"), Dir: filepath.Join(s.Opts.Dir, "offline")})
		s.Go(ctx, "offline", func(ctx context.Context) error { return s.Offline.Run(ctx, s.streamOpts("offline")...) })
	}
	if s.runs(Timers) {
		s.Timers = timer.New(timer.Config{Env: s.env("push-timers"), Dir: filepath.Join(s.Opts.Dir, "timers"),
			TransactionalID: ns + "surge-timer-push", Targets: []string{ns + "push."}})
		s.Go(ctx, "timers", s.Timers.Run)
	}
	if s.runs(CTR) {
		s.CTR = ctr.New(ctr.Config{Env: s.env("push-ctr")})
		s.Go(ctx, "ctr", func(ctx context.Context) error { return s.CTR.Run(ctx, s.streamOpts("ctr")...) })
	}
	if s.runs(Executor) {
		for _, name := range s.Opts.ExecutorNames {
			s.StartExecutor(ctx, name)
		}
	}
	return nil
}

// StartExecutor starts (or brings back) the executor called name.
func (s *Stack) StartExecutor(ctx context.Context, name string) *executor.Executor {
	x := executor.New(executor.Config{Env: s.env("executor"), Name: name, Capacity: s.Opts.ExecutorCapacity,
		Dir: filepath.Join(s.Opts.Dir, "executor-"+name)})
	s.mu.Lock()
	replaced := false
	for i, old := range s.Executors {
		if old != nil && old.UnitsTopic() == x.UnitsTopic() {
			s.Executors[i], replaced = x, true
		}
	}
	if !replaced {
		s.Executors = append(s.Executors, x)
	}
	s.mu.Unlock()
	s.Go(ctx, "executor/"+name, func(ctx context.Context) error {
		err := x.Run(ctx, s.streamOpts("executor")...)
		if errors.Is(err, executor.ErrDrained) {
			return nil
		}
		return err
	})
	return x
}

// WaitReady waits until n executors have reported to the planner.
func (s *Stack) WaitReady(ctx context.Context, n int) error {
	for {
		if s.Planner != nil && s.Planner.LiveExecutors() >= n {
			return nil
		}
		if err := s.Err(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("push: %d executors not ready: %w", n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Publish produces records as a platform does (directory changes, logins,
// jobs) and waits for the broker's acknowledgements.
func (s *Stack) Publish(ctx context.Context, recs ...*kgo.Record) error {
	cl, err := s.Kafka.NewClient(kgo.ProducerBatchMaxBytes(2 << 20))
	if err != nil {
		return err
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// PlannerGroup is the consumer group of the stack's planners.
func PlannerGroup(ns string) string { return ns + "push-planner" }

// Applied waits until the planner has consumed everything published to
// the directory's topics so far.
func (s *Stack) Applied(ctx context.Context) error {
	return streams.WaitConsumed(ctx, s.Kafka, PlannerGroup(s.Opts.Namespace), s.Directory.Topics()...)
}
