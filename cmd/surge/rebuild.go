package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	uinapp "surge/processors/uin/app"
	"surge/processors/uin/pool"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/token"
	"surge/schemas"
	"surge/streams"
	"surge/streams/metrics"
	"surge/tools/progress"
)

const rebuildUsage = `usage: surge rebuild SYSTEM|all [--force]

Rebuilds what a system keeps in Redis from its topics, the source of truth
(docs/operations.md, "Disaster recovery runbook"):
  wallet   the budget spent per phase and the coupon stock taken per
           template (wallet.grants, wallet.tokens, each order once) and the
           coupons' and pendants' order claims; --force rebuilds every
           counter, not only the missing ones (grants that need one answer
           503 meanwhile)
  uin      the uin pool: buckets, used and held bits, applied releases
           (uin.pool: every insertion, allocation, release and free); only
           when Redis lost it, or always with --force (allocations answer
           503 meanwhile; leases are dropped, their instances lease again)
  all      every system above, in turn
`

// rebuilders are the systems `surge rebuild` knows, in the order `all`
// runs them.
var rebuilders = []struct {
	name string
	run  func(ctx context.Context, v *viper.Viper, force bool) error
}{
	{"wallet", rebuildWallet},
	{"uin", rebuildUin},
}

func cmdRebuild(ctx context.Context, args []string) error {
	var force bool
	v, fs, err := loadConfig("rebuild", args, func(fs *pflag.FlagSet) {
		fs.BoolVar(&force, "force", false, "rebuild everything, not only what is missing")
	})
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprint(os.Stderr, rebuildUsage)
		return fmt.Errorf("rebuild takes one system, or all")
	}
	for _, r := range rebuilders {
		if fs.Arg(0) != "all" && fs.Arg(0) != r.name {
			continue
		}
		if err := r.run(ctx, v, force); err != nil {
			return fmt.Errorf("rebuild %s: %w", r.name, err)
		}
		if fs.Arg(0) != "all" {
			return nil
		}
	}
	if fs.Arg(0) == "all" {
		return nil
	}
	fmt.Fprint(os.Stderr, rebuildUsage)
	return fmt.Errorf("rebuild: no system %q (wallet, uin or all)", fs.Arg(0))
}

func rebuildWallet(ctx context.Context, v *viper.Viper, force bool) error {
	log := newLogger(v)
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
	total, err := streams.RecordsIn(ctx, kc, walletTopics(v.GetString("wallet.namespace"))...)
	if err != nil {
		return err
	}
	bar := progress.New("wallet records read", total)
	sum, err := in.RebuildCounters(ctx, force, func(n int) { bar.Set(int64(n)) })
	bar.Done()
	if err != nil {
		return err
	}
	fmt.Printf("wallet: rebuilt the wallet's counters from %d records in %s: %d counters (budget per phase, stock per template share; those that existed kept), %d order claims\n",
		sum.Records, sum.Took.Round(1e6), sum.Counters, sum.OrderClaims)
	return nil
}

// rebuildUin folds uin.pool back into the pool of both lanes (real and
// load-test traffic).
func rebuildUin(ctx context.Context, v *viper.Viper, force bool) error {
	log := newLogger(v)
	kc, err := needKafka(ctx, v)
	if err != nil {
		return err
	}
	rdb, err := needRedis(ctx, v, "rebuild uin")
	if err != nil {
		return err
	}
	defer rdb.Close()
	ns := v.GetString("uin.namespace")
	for _, lane := range []string{ns, schemas.ShadowPrefix + ns} {
		topic := lane + schemas.TopicPool
		total, err := streams.RecordsIn(ctx, kc, topic)
		if err != nil {
			return err
		}
		s := uinapp.New(kc, rdb, uinapp.Options{Namespace: lane, Buckets: v.GetInt("uin.buckets"), Log: log})
		if ok, err := s.Pool.HasGeneration(ctx); err != nil {
			return err
		} else if ok && !force {
			fmt.Printf("uin: the pool of %s is there (its generation is set); nothing rebuilt (--force rebuilds it anyway)\n", topic)
			continue
		}
		bar := progress.New(topic+" records read", total)
		sum, err := s.Pool.Rebuild(ctx, kc, topic, pool.RebuildOptions{Settle: v.GetDuration("uin.rebuild_settle"), Force: force,
			Held: s.Accounts.ExistMany, Progress: func(n int) { bar.Set(int64(n)) }, Log: log})
		bar.Done()
		if err != nil {
			return err
		}
		if sum.Waited {
			fmt.Printf("uin: the pool of %s was rebuilt by a running uin-pool meanwhile\n", topic)
			continue
		}
		fmt.Printf("uin: rebuilt the pool from %d records of %s in %s: %d uins used, %d pooled, %d released uins kept out (an account holds them), %d records skipped (keyed by another bucket)\n",
			sum.Records, topic, sum.Took.Round(1e6), sum.Used, sum.Pooled, sum.KeptOut, sum.Skipped)
	}
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
