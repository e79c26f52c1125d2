package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/api"
	"surge/processors/wallet/config"
	"surge/processors/wallet/counter"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/token"
	"surge/schemas"
	"surge/streams"
	"surge/streams/metrics"
)

// demoTree is the tree `surge wallet` uses without a config file: one
// activity whose official phase spans the coming days.
func demoTree() *config.Tree {
	now := time.Now().Truncate(time.Hour)
	return &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{
			{ID: "spring-test", Phase: config.PhaseTest, Start: now.Add(-48 * time.Hour), End: now.Add(-24 * time.Hour), Budget: 100_00},
			{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-24 * time.Hour), End: now.Add(7 * 24 * time.Hour), Budget: 100_000_000_00},
		},
		Scenes: []config.Scene{
			{ID: "rain", Award: "cash", MaxAmount: 888_00},
			{ID: "coupon", Award: "coupon", MaxAmount: 1, Template: "tpl-1", Stock: 1_000_000, Switches: config.Switches{StockControl: true}},
			{ID: "badge", Award: "pendant", MaxAmount: 1},
		}}}}
}

// cmdWallet runs the wallet service in one process: intake behind the
// HTTP API, the ledger, the live total.
func cmdWallet(ctx context.Context, args []string) error {
	v, _, err := loadConfig("wallet", args, nil)
	if err != nil {
		return err
	}
	log := newLogger(v)
	bs, redisAddr, stop, err := kafkaAndRedis(v, log)
	if err != nil {
		return err
	}
	defer stop()
	src := config.Static(demoTree())
	if f := v.GetString("wallet.config"); f != "" {
		if src, err = config.Load(f, log); err != nil {
			return err
		}
	}
	var keys *token.Keyring
	if seed := v.GetString("wallet.key_seed"); seed != "" {
		keys, err = token.FromSeed(v.GetString("wallet.key_id"), seed)
	} else {
		keys, err = token.Generate(v.GetString("wallet.key_id"))
		log.Warn("wallet: signing key generated for this process; set wallet.key_seed so tokens outlive it")
	}
	if err != nil {
		return err
	}
	dir := v.GetString("wallet.dir")
	if dir == "" {
		if dir, err = os.MkdirTemp("", "surge-wallet-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(bs...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	var topics []schemas.Topic
	for _, n := range []string{schemas.TopicGrants, schemas.TopicTokens, schemas.TopicLedger, schemas.TopicWithdrawals,
		schemas.TopicWithdrawResult, schemas.TopicStock, schemas.TopicDeadLetter} {
		t, _ := schemas.TopicByName(n)
		topics = append(topics, t)
	}
	if err := streams.EnsureTopics(ctx, cl, int16(v.GetInt("kafka.replication")), topics...); err != nil {
		return err
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	var backup redis.UniversalClient // nil interface when there is none
	if b := v.GetString("wallet.backup_redis"); b != "" {
		bc := redis.NewClient(&redis.Options{Addr: b})
		defer bc.Close()
		backup = bc
	}
	total := counter.New(rdb, backup, "wallet:total", log)
	go total.Run(ctx, time.Second)
	in := grant.New(grant.Deps{Config: src, Keys: keys, Redis: rdb, Producer: cl, Counter: total, Log: log, Metrics: metrics.Default})
	advertise := v.GetString("wallet.advertise")
	if advertise == "" {
		advertise = defaultAdvertise(v.GetString("wallet.http_addr"))
	}
	led := ledger.New(ledger.Config{Dir: dir, Source: src, Keys: keys, Tokens: in.Tokens(), Log: log, Metrics: metrics.Default,
		ExpectedKeys: v.GetInt("wallet.ledger_keys"), Advertise: advertise}, bs)
	opts, err := runnerOptions(v, log)
	if err != nil {
		return err
	}
	ledDone := make(chan error, 1)
	go func() { ledDone <- led.Run(ctx, opts...) }()
	batcher := grant.NewBatcher(in, v.GetInt("wallet.batch_size"), v.GetDuration("wallet.batch_linger"), v.GetInt("wallet.batchers"))
	defer batcher.Close()
	srv := &api.Server{Intake: in, Batcher: batcher, Ledger: led, Counter: total, Producer: cl, Redis: rdb, Config: src, Log: log,
		Advertise: advertise}
	if err := srv.FollowResults(ctx, bs); err != nil {
		return err
	}
	serveMetrics(ctx, v, log)
	hs := &http.Server{Addr: v.GetString("wallet.http_addr"), Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	log.Info("wallet API", "url", fmt.Sprintf("http://%s/v1/", hs.Addr))
	err = hs.ListenAndServe()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, <-ledDone)
}

// defaultAdvertise is the URL other instances reach this one's API at when
// wallet.advertise is not set: the listen address, with this host's name
// for a wildcard host.
func defaultAdvertise(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "http://" + listen
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
