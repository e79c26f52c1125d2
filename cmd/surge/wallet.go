package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/app"
	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/token"
	"surge/streams"
	"surge/streams/admission"
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
	if len(args) > 0 {
		switch args[0] {
		case "keygen":
			fmt.Println(auth.NewSecret())
			return nil
		case "token":
			return cmdWalletToken(args[1:])
		case "sign":
			return cmdWalletSign(args[1:])
		}
	}
	v, _, err := loadConfig("wallet", args, nil)
	if err != nil {
		return err
	}
	return serveWallet(ctx, v, false)
}

// serveWallet runs a wallet instance: intake, ledger, live total,
// wallet-identities and the HTTP API. As a service (surge run wallet) it
// needs Kafka and Redis; "surge wallet" alone starts kfake and miniredis
// in their place.
func serveWallet(ctx context.Context, v *viper.Viper, service bool) error {
	log := newLogger(v)
	pct, ok, err := walletGCPercent(v, os.Getenv)
	if err != nil {
		return err
	}
	if ok {
		debug.SetGCPercent(pct)
	}
	apps, users, err := walletAuth(v, log)
	if err != nil {
		return err
	}
	var bs streams.Cluster
	var rdb redis.UniversalClient
	if service {
		if bs, err = needKafka(ctx, v); err != nil {
			return err
		}
		if rdb, err = needRedis(ctx, v, "the wallet"); err != nil {
			return err
		}
		defer rdb.Close()
	} else {
		var stop func()
		if bs, rdb, stop, err = kafkaAndRedis(ctx, v, log); err != nil {
			return err
		}
		defer stop()
	}
	release, err := claimInstanceID(v, "wallet", log)
	if err != nil {
		return err
	}
	defer release()
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
	dir, cleanup, err := stateDir(v.GetString("wallet.dir"), "surge-wallet-", log)
	if err != nil {
		return err
	}
	defer cleanup()
	cl, err := bs.NewClient(kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	var backup redis.UniversalClient // nil interface when there is none
	if b := v.GetString("wallet.backup_redis"); b != "" {
		bc, err := redisAt(v, strings.Split(b, ",")...)
		if err != nil {
			return fmt.Errorf("wallet.backup_redis: %w", err)
		}
		defer bc.Close()
		backup = bc
	}
	advertise := v.GetString("wallet.advertise")
	if advertise == "" {
		advertise = defaultAdvertise(v.GetString("wallet.http_addr"))
	}
	w, err := app.New(app.Options{Kafka: bs, Namespace: v.GetString("wallet.namespace"), Dir: dir, Source: src, Keys: keys,
		Redis: rdb, BackupRedis: backup, Producer: cl, Apps: apps, Users: users, Advertise: advertise,
		InstanceID: v.GetString("processor.instance_id"), ExpectedKeys: v.GetInt("wallet.ledger_keys"),
		BatchSize: v.GetInt("wallet.batch_size"), BatchLinger: v.GetDuration("wallet.batch_linger"), Batchers: v.GetInt("wallet.batchers"),
		RebuildSettle: v.GetDuration("wallet.rebuild_settle"), Log: log, Metrics: metrics.Default})
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.EnsureTopics(ctx, replication(v)); err != nil {
		return err
	}
	opts, err := runnerOptions(v, log)
	if err != nil {
		return err
	}
	ledDone := make(chan error, 1)
	go func() { ledDone <- w.Run(ctx, opts...) }()
	if err := w.Start(ctx); err != nil {
		return err
	}
	if err := serveMetrics(ctx, v, log); err != nil {
		return err
	}
	gates, limits := httpLimits(v, "wallet")
	err = admission.Serve(ctx, v.GetString("wallet.http_addr"), admission.Server(w.Handler(gates), limits), limits,
		func(a net.Addr) { log.Info("wallet API", "url", fmt.Sprintf("http://%s/v1/", a)) })
	return errors.Join(err, <-ledDone)
}

// httpLimits are the admission bounds and the server limits of an HTTP
// API, from the http.* keys.
func httpLimits(v *viper.Viper, service string) (admission.Config, admission.Limits) {
	return admission.Config{Name: service, MaxInFlight: v.GetInt("http.max_in_flight"),
			MaxQueue: v.GetInt("http.max_queue"), Timeout: v.GetDuration("http.request_timeout"), MaxWait: v.GetDuration("http.max_wait"),
			TargetLatency: v.GetDuration("http.target_latency")},
		admission.Limits{Read: v.GetDuration("http.read_timeout"), Idle: v.GetDuration("http.idle_timeout"),
			MaxConns: v.GetInt("http.max_conns")}
}

// walletGCPercent is the GC target to set for the wallet process:
// wallet.gc_percent, unless GOGC is in the environment (the Go runtime has
// applied it already, and an operator who set it means it).
// It must be positive, or -1 (the collector off: only with GOMEMLIMIT,
// which then alone starts a collection).
func walletGCPercent(v *viper.Viper, getenv func(string) string) (int, bool, error) {
	if getenv("GOGC") != "" {
		return 0, false, nil
	}
	raw := v.GetString("wallet.gc_percent")
	pct, err := strconv.Atoi(strings.TrimSpace(raw))
	switch {
	case err != nil || pct == 0 || pct < -1:
		return 0, false, fmt.Errorf("wallet.gc_percent %q: want a positive percentage (Go's GOGC; 100 is Go's default), or -1 with GOMEMLIMIT set", raw)
	case pct == -1 && getenv("GOMEMLIMIT") == "":
		return 0, false, errors.New("wallet.gc_percent -1 turns the collector off: set GOMEMLIMIT too, or the heap grows without bound")
	}
	return pct, true, nil
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

// walletAuth reads the app and user keys; either missing is generated for
// this process and logged, so a first run works, and warned about.
func walletAuth(v *viper.Viper, log *slog.Logger) (*auth.Apps, *auth.Users, error) {
	if v.GetBool("wallet.require_keys") {
		var missing []string
		for _, k := range []string{"wallet.key_seed", "wallet.app_keys", "wallet.user_keys"} {
			if v.GetString(k) == "" {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			return nil, nil, fmt.Errorf("wallet.require_keys is set but %s not configured (env SURGE_%s...; `surge wallet keygen` makes a secret)",
				strings.Join(missing, ", "), strings.ToUpper(strings.ReplaceAll(missing[0], ".", "_")))
		}
	}
	apps, err := keysOrGenerated(v, log, "wallet.app_keys", "demo:demo-1:", auth.ParseAppKeys)
	if err != nil {
		return nil, nil, err
	}
	users, err := keysOrGenerated(v, log, "wallet.user_keys", "u-1:", auth.ParseUserKeys)
	if err != nil {
		return nil, nil, err
	}
	return auth.NewApps(apps), auth.NewUsers(users), nil
}

// keysOrGenerated parses the keys of option key, or makes one (prefix and
// a new secret) for this process when none are configured: what it
// signs or verifies dies with the process.
func keysOrGenerated(v *viper.Viper, log *slog.Logger, key, prefix string, parse func(string) ([]auth.Key, error)) ([]auth.Key, error) {
	keys, err := parse(v.GetString(key))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	if len(keys) == 0 {
		generated := prefix + auth.NewSecret()
		keys, _ = parse(generated)
		log.Warn("wallet: no "+key+"; generated one for this process (what it signs fails after a restart)", key, generated)
	}
	return keys, nil
}

// cmdWalletToken issues a user token: what the login service does with
// the same key, for operators and tests.
func cmdWalletToken(args []string) error {
	var sub string
	v, _, err := loadConfig("wallet token", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&sub, "sub", "", "the user (actID) the token is for")
	})
	if err != nil {
		return err
	}
	keys, err := auth.ParseUserKeys(v.GetString("wallet.user_keys"))
	if err != nil {
		return fmt.Errorf("wallet.user_keys: %w", err)
	}
	tok, err := auth.NewUsers(keys).Issue(sub, v.GetDuration("wallet.token_ttl"), time.Now())
	if err != nil {
		return err
	}
	fmt.Println(tok)
	return nil
}

// cmdWalletSign prints the headers that sign an app's request (the body
// is read from stdin), for curl and for checking a client's signer.
func cmdWalletSign(args []string) error {
	var app, method, path string
	v, _, err := loadConfig("wallet sign", args, func(fs *pflag.FlagSet) {
		fs.StringVar(&app, "key", "", "the key id to sign with (one of wallet.app_keys)")
		fs.StringVar(&method, "method", http.MethodPost, "the request's method")
		fs.StringVar(&path, "path", "/v1/grants", "the request's path and query")
	})
	if err != nil {
		return err
	}
	keys, err := auth.ParseAppKeys(v.GetString("wallet.app_keys"))
	if err != nil {
		return fmt.Errorf("wallet.app_keys: %w", err)
	}
	i := slices.IndexFunc(keys, func(k auth.Key) bool { return k.ID == app })
	if i < 0 {
		return fmt.Errorf("no app key %q in wallet.app_keys", app)
	}
	body, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(method, "http://wallet"+path, nil)
	if err != nil {
		return err
	}
	auth.Sign(req, body, keys[i], time.Now())
	for _, h := range []string{auth.HeaderKey, auth.HeaderTimestamp, auth.HeaderSignature} {
		fmt.Printf("%s: %s\n", h, req.Header.Get(h))
	}
	return nil
}

// runWalletIdentities runs wallet-identities alone, for a deployment that
// scales it apart from the API (`surge wallet` runs it too, in the same
// consumer group: the two share its partitions).
func runWalletIdentities(ctx context.Context, v *viper.Viper, log *slog.Logger, bs streams.Cluster, opts []streams.Option) error {
	rdb, err := needRedis(ctx, v, "wallet-identities (the actIDs are kept there)")
	if err != nil {
		return err
	}
	defer rdb.Close()
	p := identity.New(identity.Config{Env: streams.Env{Kafka: bs, Namespace: v.GetString("wallet.namespace"), Log: log,
		Metrics: metrics.Default}, Redis: rdb})
	return p.Run(ctx, opts...)
}
