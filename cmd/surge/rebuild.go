package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"

	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/token"
	"surge/schemas"
	"surge/streams"
	"surge/streams/metrics"
	"surge/tools/progress"
)

const rebuildUsage = `usage: surge rebuild SYSTEM [--force]

Rebuilds what a system keeps in Redis from its topics, the source of truth
(docs/operations.md, "Disaster recovery runbook"):
  wallet   the budget spent per phase and the coupon stock taken per
           template (wallet.grants, wallet.tokens, each order once) and the
           coupons' and pendants' order claims; --force rebuilds every
           counter, not only the missing ones (grants that need one answer
           503 meanwhile)
`

func cmdRebuild(ctx context.Context, args []string) error {
	var force bool
	v, fs, err := loadConfig("rebuild", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&force, "force", false, "rebuild every counter, not only the missing ones")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprint(os.Stderr, rebuildUsage)
		return fmt.Errorf("rebuild takes one system")
	}
	log := newLogger(v)
	switch fs.Arg(0) {
	case "wallet":
	default:
		fmt.Fprint(os.Stderr, rebuildUsage)
		return fmt.Errorf("rebuild: %q has no rebuild yet (wallet has)", fs.Arg(0))
	}
	kc, err := needKafka(ctx, v)
	if err != nil {
		return err
	}
	rdb, err := needRedis(ctx, v, "rebuild wallet")
	if err != nil {
		return err
	}
	defer rdb.Close()
	src := config.Static(demoTree())
	if f := v.GetString("wallet.config"); f != "" {
		if src, err = config.Load(f, log); err != nil {
			return err
		}
	}
	keys, err := token.Generate("rebuild") // signs nothing: the intake needs a keyring to exist
	if err != nil {
		return err
	}
	in := grant.New(grant.Config{Env: streams.Env{Kafka: kc, Namespace: v.GetString("wallet.namespace"), Log: log, Metrics: metrics.NewRegistry()},
		Source: src, Keys: keys, Redis: rdb, RebuildSettle: v.GetDuration("wallet.rebuild_settle")})
	total, err := recordsIn(ctx, kc, walletTopics(v.GetString("wallet.namespace"))...)
	if err != nil {
		return err
	}
	bar := progress.New("records read", total)
	sum, err := in.RebuildCounters(ctx, force, func(n int) { bar.Set(int64(n)) })
	bar.Done()
	if err != nil {
		return err
	}
	fmt.Printf("rebuilt the wallet's counters from %d records in %s: %d counters (budget per phase, stock per template share; those that existed kept), %d order claims\n",
		sum.Records, sum.Took.Round(1e6), sum.Counters, sum.OrderClaims)
	return nil
}

// walletTopics are the topics the wallet's counters are rebuilt from, of
// both lanes (real and load-test traffic).
func walletTopics(ns string) []string {
	var out []string
	for _, lane := range []string{ns, schemas.ShadowPrefix + ns} {
		out = append(out, lane+schemas.TopicGrants, lane+schemas.TopicTokens)
	}
	return out
}

// recordsIn is how many records the topics hold (end less start offsets;
// a topic that does not exist holds none), for a progress bar.
func recordsIn(ctx context.Context, kc streams.Cluster, topics ...string) (int64, error) {
	cl, err := kc.NewClient()
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return 0, err
	}
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok && o.Err == nil && s.Err == nil {
			n += o.Offset - s.Offset
		}
	})
	return n, nil
}
