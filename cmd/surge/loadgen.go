package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	push "surge/processors/push/app"
	"surge/processors/push/planner"
	"surge/streams"
	"surge/tools/pushload"
)

// cmdLoadgen drives realistic mass-push traffic through the push services
// by producing to their topics only: accounts, follower lists (Zipf over
// accounts), tags, logins and churn, and jobs of every source, size and
// priority, a few of them malformed. On the embedded broker it starts the
// services in this process first; with --kafka.brokers it drives the
// deployed ones. It follows push.job-transitions until every job ended,
// reads push.reports back, and fails if a user got a job's message twice,
// a targeted online user got nothing, or a malformed job was accepted.
func cmdLoadgen(ctx context.Context, args []string) error {
	v, _, err := loadConfig("loadgen", args, nil)
	if err != nil {
		return err
	}
	log := newLogger(v)
	deployed := v.GetString("kafka.brokers") != ""
	bs, stopKafka, err := kafkaOrEmbedded(ctx, v, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	ns := v.GetString("push.namespace")
	cl, err := bs.NewClient(kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(1<<20),
		kgo.ProducerBatchMaxBytes(1<<20))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := streams.EnsureTopics(ctx, cl, replication(v), push.Topics(ns)...); err != nil {
		return err
	}
	if err := serveMetrics(ctx, v, log); err != nil {
		return err
	}
	sctx, stopStack := context.WithCancel(ctx)
	defer stopStack()
	stackErr := func() error { return nil }
	if !deployed {
		// The stack runs on a day of its own, so a demo run at any hour
		// sends at once rather than wait for the day's first quota
		// release (at 01:30 UTC, 97 of 100 jobs waited).
		stack, stop, err := startPushStack(sctx, v, log, bs, nil, planner.ReleasedDayClock(planner.DefaultConfig().QuotaSeed))
		if err != nil {
			return err
		}
		defer stop()
		stackErr = stack.Err
	} else {
		fmt.Fprintf(os.Stderr, "loadgen: driving the deployed push services on %v (namespace %q)\n", bs, ns)
	}

	return pushload.Run(ctx, cl, bs, ns, pushload.Config{Users: v.GetInt("loadgen.users"), Accounts: v.GetInt("loadgen.accounts"),
		Jobs: v.GetInt("loadgen.jobs"), Churn: v.GetInt("loadgen.churn"), Zipf: v.GetFloat64("loadgen.zipf"),
		Online: v.GetFloat64("loadgen.online"), Seed: int64(v.GetInt("loadgen.seed")), Timeout: v.GetDuration("loadgen.timeout")},
		stackErr, stopStack)
}
