package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/spf13/viper"

	"surge/platform/supervise"
	push "surge/processors/push/app"
	"surge/processors/push/planner"
	"surge/streams"
	"surge/streams/metrics"
)

// pushServices are the `surge run` names of the push processors, each
// one component of the push stack in its own process.
var pushServices = map[string]string{
	"push-presence": push.Presence, // presence behind push.namespace, without the Redis mirror
	"push-planner":  push.Planner,
	"push-executor": push.Executor,
	"push-offline":  push.Offline,
	"push-timers":   push.Timers,
	"push-ctr":      push.CTR, // click-through per job, for the account quota
}

var executorName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)

// startPushStack starts the push components named (all when none) with
// the push.* configuration; stop removes its temporary directory.
func startPushStack(ctx context.Context, v *viper.Viper, log *slog.Logger, bs streams.Cluster, components []string, now func() time.Time) (*push.Stack, func(), error) {
	dir, stop, err := stateDir(v.GetString("push.dir"), "surge-push-", log)
	if err != nil {
		return nil, nil, err
	}
	cfg := planner.DefaultConfig()
	cfg.UnitSize, cfg.MaxBacklog, cfg.MinLead = uint64(v.GetInt("push.unit_size")), v.GetInt("push.max_backlog"), v.GetDuration("push.min_lead")
	cfg.CheckpointEvery = v.GetDuration("push.planner_checkpoint_every")
	cfg.ReassignAfter = v.GetDuration("push.reassign_after")
	cfg.Now = now // nil: the wall clock
	opts, err := runnerOptions(v, log)
	if err != nil {
		stop()
		return nil, nil, err
	}
	o := push.Options{Namespace: v.GetString("push.namespace"), Replication: replication(v), Dir: dir, Components: components,
		Executors: v.GetInt("push.executors"), ExecutorCapacity: uint64(v.GetInt64("push.executor_capacity")),
		Planner: cfg, MirrorThreshold: uint64(v.GetInt("push.mirror_threshold")),
		Log: log, Metrics: metrics.Default, StreamOpts: opts}
	if len(components) == 1 && components[0] == push.Executor {
		name := v.GetString("push.executor_name")
		if name == "" {
			name = v.GetString("processor.instance_id")
		}
		if name == "" {
			name, _ = os.Hostname()
		}
		if !executorName.MatchString(name) {
			stop()
			return nil, nil, fmt.Errorf("push.executor_name %q must match %s (it names the topic push.units.<name>)", name, executorName)
		}
		o.ExecutorNames = []string{name}
	}
	s := push.New(bs, o)
	if err := s.Start(ctx); err != nil {
		stop()
		return nil, nil, err
	}
	return s, func() { _ = s.Wait(); stop() }, nil
}

// runPush runs one push service until ctx ends or it fails (the process
// then exits non-zero, for its supervisor to restart it).
func runPush(ctx context.Context, v *viper.Viper, log *slog.Logger, bs streams.Cluster, component string) error {
	if component == push.Executor {
		return runExecutor(ctx, v, log, bs)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, stop, err := startPushStack(ctx, v, log, bs, []string{component}, nil)
	if err != nil {
		return err
	}
	err = untilStopped(ctx, cancel, s.Group)
	stop()
	return err
}

// runExecutor runs one executor. The first SIGTERM (or interrupt) drains
// it for an upgrade: it tells the planner it takes nothing new, finishes
// the units it was given, and exits 0, so nothing is lost or sent twice. A
// second signal, or push.drain_timeout, stops it at once; what it held is
// then resumed when it comes back under the same name.
func runExecutor(signalled context.Context, v *viper.Viper, log *slog.Logger, bs streams.Cluster) error {
	// The stack outlives the first signal: it is what the drain needs.
	ctx, cancel := context.WithCancel(context.WithoutCancel(signalled))
	defer cancel()
	s, stop, err := startPushStack(ctx, v, log, bs, []string{push.Executor}, nil)
	if err != nil {
		return err
	}
	defer stop()
	for signalled.Err() == nil && s.Err() == nil && !s.Executors[0].Drained() {
		select {
		case <-signalled.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	x := s.Executors[0]
	if signalled.Err() != nil && s.Err() == nil && !x.Drained() {
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(again)
		timeout := v.GetDuration("push.drain_timeout")
		log.Info("executor: draining: finishing its units, taking no new ones (a second signal stops at once)",
			"executor", x.UnitsTopic(), "timeout", timeout)
		x.Drain()
		deadline := time.After(timeout)
	drain:
		for !x.Drained() && s.Err() == nil {
			select {
			case <-again:
				log.Warn("executor: second signal: stopping without finishing the drain; its queue resumes when it returns")
				break drain
			case <-deadline:
				log.Warn("executor: drain timed out; stopping; its queue resumes when it returns", "timeout", timeout)
				break drain
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	cancel()
	return s.Wait()
}

// untilStopped runs a service's components until ctx ends or one of them
// fails (the process then exits non-zero, for its supervisor to restart
// it), then stops the rest and waits for them.
func untilStopped(ctx context.Context, cancel context.CancelFunc, g *supervise.Group) error {
	for ctx.Err() == nil && g.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	cancel()
	return g.Wait()
}
