// Command surge runs the product's streaming pipeline: its processors and
// sinks, an embedded stack for a machine with no servers, and operator
// helpers to list topics, produce, consume and replay records.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/health"
	"surge/streams/metrics"
)

const usage = `surge: the streaming back end (mass push, reward wallet, uin recycling)

usage: surge <command> [flags]     (surge <command> --help for its flags)

commands:
  embedded   start in-process Kafka (kfake) and ClickHouse (chDB), create every
             topic, run the processors and sinks, drive generated login
             traffic with a progress bar, print a summary
  loadgen    mass push under load: N users, M accounts with Zipf-distributed
             followers, login churn, jobs of mixed source, size and priority,
             through the whole push stack (kfake unless --kafka.brokers), with
             a progress bar and a check that nobody got a message twice
  wallet     the reward wallet: grant intake, ledger, live total and the HTTP
             API (POST /v1/grants, GET /v1/users/{act}/balance|flow, POST
             /v1/users/{act}/withdrawals, GET /v1/total); kfake and miniredis
             unless --kafka.brokers / --redis.addr (the service: surge run wallet)
  uin        uin recycling: "uin run" (registration tracker, recycle controller,
             timers), "uin classify" (stock classification from ClickHouse),
             "uin restore --username U", "uin gaps --ranges A-B", "uin demo"
             (the stock pipeline end to end on synthetic accounts, embedded)
  push       control a send job: "push pause|resume|cancel --job ID [--reason R]"
  run NAME   run one processor or sink against the configured servers: presence,
             push-presence, push-planner, push-executor, push-offline, push-timers,
             push-ctr, uin-tracker, uin-recycle, uin-timers, uin-pool, uin-restore,
             wallet (API and ledger; 'surge wallet' runs it on kfake and
             miniredis), wallet-identities, sink-* (one per ClickHouse table); 'surge run --help' lists them all
  recon      reconciliation over ClickHouse: "recon report [--json]" (status
             per hour, open mismatches, totals), "recon run --hour TIME"
             (one hour now), "recon serve" (h+1, h+2 fallback, every minute)
  topics     list the topic registry; --create creates the topics;
             --graph [--format text|mermaid|dot] who produces and consumes each
  produce    produce records: --topic T --json '{...}' [--key K], or one per
             line of stdin (the message, or the envelope consume prints)
  consume    print a topic's records as JSON: --topic T [--max N] [--follow
             [--from-end]] [--partition P] [--offset O | --since TIME] [--key K]
  schemas    "schemas export" the FileDescriptorSet of every topic's schema
             (protoc --decode, kcat, Kafka UIs); "schemas list" topic -> schema
  replay     re-read a topic from --offset N or --since TIME into --into TOPIC
             (or print it)
  rebuild    rebuild a system's Redis state from its topics: "rebuild
             wallet|uin|all [--force]" (the wallet's budget and stock
             counters and order claims; the uin pool)
  clickhouse serve: the embedded chDB over ClickHouse's HTTP interface, for
             sinks, classify and recon as separate processes
  config     print the effective configuration
  version    print the build (version, VCS revision, Go version)
  probe      ask this host's service if it is ready (/readyz on metrics.addr;
             --live: /healthz): exit 0 when it is; the image's HEALTHCHECK
  completion bash|zsh: shell completion of commands and each command's flags
             (source <(surge completion bash))

Each command's --help lists its own flags; every configuration key can also
be set in a --config file (YAML, TOML or JSON) or as SURGE_<KEY> (dots as _).
`

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		fmt.Print(usage)
		return
	}
	cmd, args := os.Args[1], os.Args[2:]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd {
	case "recon":
		err = cmdRecon(ctx, args)
	case "uin":
		err = cmdUin(ctx, args)
	case "push":
		err = cmdPush(ctx, args)
	case "completion":
		err = cmdCompletion(args)
	case "wallet":
		err = cmdWallet(ctx, args)
	case "loadgen":
		err = cmdLoadgen(ctx, args)
	case "embedded":
		err = cmdEmbedded(ctx, args)
	case "run":
		err = cmdRun(ctx, args)
	case "topics":
		err = cmdTopics(ctx, args)
	case "produce":
		err = cmdProduce(ctx, args)
	case "schemas":
		err = cmdSchemas(ctx, args)
	case "consume":
		err = cmdConsume(ctx, args)
	case "replay":
		err = cmdReplay(ctx, args)
	case "rebuild":
		err = cmdRebuild(ctx, args)
	case "version", "--version":
		cmdVersion()
	case "clickhouse":
		err = cmdClickhouse(ctx, args)
	case "probe":
		err = cmdProbe(ctx, args)
	case "config":
		var v *viper.Viper
		if v, _, err = loadConfig("config", args, nil); err == nil {
			printConfig(v)
		}
	default:
		fmt.Fprintf(os.Stderr, "surge: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "surge:", err)
		os.Exit(1)
	}
}

func newLogger(v *viper.Viper) *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(v.GetString("log.level"))); err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if v.GetString("log.format") == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	l := slog.New(h)
	slog.SetDefault(l)
	return l
}

// serveMetrics exposes the default registry until ctx ends. The address
// is bound before the service starts: a port already taken (another
// service on this host) is an error, not a warning, since /readyz there
// would answer for the other service (surge probe, a container's health
// check).
func serveMetrics(ctx context.Context, v *viper.Viper, log *slog.Logger) error {
	addr := v.GetString("metrics.addr")
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics.addr %s: %w (another service on this host? give each its own --metrics.addr, or empty to serve none)", addr, err)
	}
	registerBuildInfo(metrics.Default)
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Default.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.Handle("/readyz", health.Default.Handler()) // joined its groups; brokers and Redis answer
	if v.GetBool("metrics.pprof") {
		// Go's profiler, for "profile before you tune" on a live instance;
		// off by default: a profile shows the code's internals.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint stopped", "addr", addr, "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("metrics", "url", "http://"+addr+"/metrics")
	return nil
}

// runnerOptions turns processor.* config into runtime options.
func runnerOptions(v *viper.Viper, log *slog.Logger) ([]streams.Option, error) {
	opts := []streams.Option{
		streams.Logger(log),
		streams.MaxBatch(v.GetInt("processor.max_batch")),
		streams.MaxRecordBytes(v.GetInt("processor.max_record_bytes")),
		streams.MaxAttempts(v.GetInt("processor.max_attempts")),
		streams.ShutdownTimeout(v.GetDuration("processor.shutdown_timeout")),
	}
	if id := v.GetString("processor.instance_id"); id != "" {
		opts = append(opts, streams.InstanceID(id))
	}
	if d := v.GetDuration("processor.session_timeout"); d > 0 {
		opts = append(opts, streams.ClientOpts(kgo.SessionTimeout(d), kgo.HeartbeatInterval(max(d/10, 100*time.Millisecond))))
	}
	// Static membership under the stable instance id (configured, or the
	// host's slot that claimInstanceID set): a restart after kill -9
	// takes its place back at once instead of waiting out its dead self.
	if v.GetBool("processor.static_membership") && v.GetString("processor.instance_id") != "" {
		opts = append(opts, streams.StaticMembership())
	}
	if g := v.GetString("processor.guarantee"); g != "" {
		gg, err := streams.ParseGuarantee(g)
		if err != nil {
			return nil, err
		}
		opts = append(opts, streams.WithGuarantee(gg))
	}
	return opts, nil
}
