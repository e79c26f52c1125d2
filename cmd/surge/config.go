package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/app"
	"surge/streams"
	"surge/streams/connect"
	"surge/streams/embedded"
	"surge/streams/health"
)

// Every option, its default and what it does. Each is settable in the
// config file (--config, YAML/TOML/JSON, nested by the dots), by env
// (SURGE_ + upper case, dots as underscores: SURGE_KAFKA_BROKERS) and by
// flag (--kafka.brokers). Flags win over env, env over the file.
var options = []struct {
	key  string
	def  any
	help string
}{
	{"kafka.brokers", "", "comma-separated seed brokers; empty in `embedded` starts an in-process kfake broker"},
	{"kafka.embedded_dir", "", "`embedded`: keep kfake's data here across restarts; empty keeps it in memory"},
	{"kafka.replication", 0, "replication factor of the topics surge creates (`topics --create`, services at start); 0: the cluster's broker count, 3 at most"},
	{"kafka.min_insync_replicas", 0, "min.insync.replicas of the topics surge creates (producers write with acks=all); 0: the replication factor less one, at least 1"},
	{"kafka.connect_timeout", 10 * time.Second, "how long a command or service tries to reach the brokers at start before it stops with the reason (a refused password or untrusted certificate stops it at once)"},
	{"kafka.tls.enabled", false, "connect to the brokers over TLS (implied by any other kafka.tls.* key)"},
	{"kafka.tls.ca_file", "", "PEM file of the CAs that sign the brokers' certificates; empty: the system's roots"},
	{"kafka.tls.cert_file", "", "PEM client certificate, for brokers that authenticate clients by TLS (with kafka.tls.key_file)"},
	{"kafka.tls.key_file", "", "PEM private key of kafka.tls.cert_file"},
	{"kafka.tls.server_name", "", "name the brokers' certificates must carry, when not the host dialled"},
	{"kafka.tls.insecure_skip_verify", false, "do not verify the brokers' certificates (tests only: anyone on the path can read and change the traffic)"},
	{"kafka.sasl.mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty: no SASL"},
	{"kafka.sasl.username", "", "SASL user"},
	{"kafka.sasl.password", "", "SASL password: from SURGE_KAFKA_SASL_PASSWORD or the config file, never a flag"},
	{"kafka.sasl.password_file", "", "file holding the SASL password (a mounted secret), instead of kafka.sasl.password"},
	{"processor.guarantee", "", "override a processor's delivery guarantee: exactly-once or at-least-once"},
	{"processor.instance_id", "", "stable id of this instance (transactional id); default the host name, with -2, -3... for further instances of the same service on this host (a lock file per slot in the temporary directory; a restart takes its slot back)"},
	{"processor.max_batch", 10000, "records per batch / transaction"},
	{"processor.max_record_bytes", 1 << 20, "larger inputs are dead-lettered"},
	{"processor.max_attempts", 5, "transient failures per record before it is dead-lettered"},
	{"processor.session_timeout", time.Duration(0), "consumer group session timeout: how soon a killed instance's partitions move to the others (0: the service's own, 10s for most, 6s for the push planner)"},
	{"processor.static_membership", true, "join with processor.instance_id (configured, or this host's slot) as a static member: a restarted instance takes its partitions back at once; a graceful stop leaves the group so its partitions move at once"},
	{"processor.shutdown_timeout", 30 * time.Second, "how long shutdown may take to finish the batch in flight"},
	{"redis.addr", "", "Redis: the wallet's balances and claims, the uin pool and accounts, the online bitmap's mirror; comma-separated for cluster and sentinel modes; empty: an in-process miniredis in `embedded`, `wallet` and `uin demo`, no mirror in `run`"},
	{"redis.mode", "single", "single (one server or a proxy), cluster (Redis Cluster; any nodes seed it) or sentinel (redis.addr lists the sentinels)"},
	{"redis.sentinel_master", "", "sentinel mode: the name of the monitored master"},
	{"redis.username", "", "Redis ACL user; empty: the default user"},
	{"redis.password", "", "Redis password (ACL user's, or requirepass): from SURGE_REDIS_PASSWORD or the config file, never a flag"},
	{"redis.password_file", "", "file holding the Redis password (a mounted secret), instead of redis.password"},
	{"redis.tls.enabled", false, "connect to Redis over TLS (implied by any other redis.tls.* key)"},
	{"redis.tls.ca_file", "", "PEM file of the CAs that sign Redis's certificate; empty: the system's roots"},
	{"redis.tls.cert_file", "", "PEM client certificate, for a Redis with tls-auth-clients (with redis.tls.key_file)"},
	{"redis.tls.key_file", "", "PEM private key of redis.tls.cert_file"},
	{"redis.tls.server_name", "", "name Redis's certificate must carry, when not the host dialled"},
	{"redis.tls.insecure_skip_verify", false, "do not verify Redis's certificate (tests only)"},
	{"redis.connect_timeout", 10 * time.Second, "how long a command or service tries to reach Redis at start before it stops with the reason (a refused password stops it at once)"},
	{"redis.prefix", "online:", "key prefix of the online bitmap shards (use shadow.online: for load tests)"},
	{"sink.max_batch", 100000, "rows per sink insert: ClickHouse wants few large inserts (overrides processor.max_batch for sink-*)"},
	{"sink.tasks", 2, "tasks per sink: members of its group in this process, each inserting its own batches at once (Kafka Connect's tasks.max)"},
	{"clickhouse.dsn", "", "ClickHouse server DSN (clickhouse://host:9000/db, clickhouse://host:9440/db?secure=true, or http://host:8123/db); empty uses embedded chDB"},
	{"clickhouse.username", "", "ClickHouse user (wins over the DSN's)"},
	{"clickhouse.password", "", "ClickHouse password: from SURGE_CLICKHOUSE_PASSWORD or the config file, never a flag (wins over the DSN's)"},
	{"clickhouse.password_file", "", "file holding the ClickHouse password (a mounted secret), instead of clickhouse.password"},
	{"clickhouse.tls.enabled", false, "connect to ClickHouse over TLS (implied by any other clickhouse.tls.* key)"},
	{"clickhouse.tls.ca_file", "", "PEM file of the CAs that sign ClickHouse's certificate; empty: the system's roots"},
	{"clickhouse.tls.cert_file", "", "PEM client certificate (with clickhouse.tls.key_file)"},
	{"clickhouse.tls.key_file", "", "PEM private key of clickhouse.tls.cert_file"},
	{"clickhouse.tls.server_name", "", "name ClickHouse's certificate must carry, when not the host dialled"},
	{"clickhouse.tls.insecure_skip_verify", false, "do not verify ClickHouse's certificate (tests only)"},
	{"clickhouse.cluster", "", "ClickHouse cluster (remote_servers) to create the tables on: replicated local tables and Distributed ones over them, every DDL ON CLUSTER; empty: one server"},
	{"clickhouse.replication_path", "/clickhouse/tables", "with clickhouse.cluster: the ZooKeeper/Keeper path under which the replicated tables live ({shard}/{database}/<table> follow)"},
	{"clickhouse.chdb_dir", "", "chDB data directory in embedded mode; empty is a temporary one"},
	{"clickhouse.serve_addr", "127.0.0.1:8123", "`clickhouse serve`: where the embedded chDB is served over ClickHouse's HTTP interface (a password is required on any address but loopback)"},
	{"clickhouse.chdb_connections", 0, "chDB queries and inserts that may run at once; 0 is the number of CPUs (at most 8)"},
	{"metrics.addr", "127.0.0.1:9464", "address of the Prometheus /metrics endpoint; empty disables it"},
	{"metrics.pprof", false, "serve Go's profiler (/debug/pprof/: CPU, heap, goroutines, trace) on metrics.addr, to profile a live instance"},
	{"log.level", "info", "debug, info, warn or error"},
	{"log.format", "text", "text (slog's key=value lines) or json (one JSON object per line, for a log pipeline)"},
	{"demo.users", 200000, "`embedded`: users in the generated login traffic; 0 serves until interrupted"},
	{"demo.seed", 1, "`embedded`: random seed of the generated traffic"},
	{"push.dir", "", "mass push: number packages and Pebble stores live here; empty is a temporary directory"},
	{"push.namespace", "", "mass push: prefix of every push topic (shadow. for load-test traffic)"},
	{"push.executors", 2, "mass push: executors started in process (`loadgen` on the embedded broker)"},
	{"push.executor_name", "", "`run push-executor`: this executor's name (its unit queue is push.units.<name>); empty: processor.instance_id, else the host name"},
	{"push.unit_size", 1 << 18, "mass push: uins per dispatched unit"},
	{"push.max_backlog", 8, "mass push: units an executor may hold not yet done"},
	{"push.min_lead", 15 * time.Minute, "mass push: a scheduled job starts at least this long after creation"},
	{"push.reassign_after", 5 * time.Second, "mass push: an executor silent this long (killed, its machine gone) has its units not yet done taken back and sent by the others; it is fenced and never sends them; negative: never"},
	{"push.mirror_threshold", 10_000_000, "mass push: accounts with this many followers use the local fan-list mirror"},
	{"push.executor_capacity", 0, "`run push-executor`: uins this executor takes at once (it reports it; the planner keeps its units in flight within it, at least one); 0: only push.max_backlog limits it"},
	{"push.drain_timeout", time.Minute, "`run push-executor`: on SIGTERM the executor drains (takes nothing new, finishes its units, exits 0) for at most this long"},
	{"push.planner_checkpoint_every", 30 * time.Second, "mass push: how often the active planner checkpoints its memory to push.planner-checkpoints (a restore replays only the transitions after it); 0: never, every restore replays all"},
	{"wallet.config", "", "`wallet`: activity tree file (YAML/TOML/JSON), reloaded on change; empty uses a built-in demo tree"},
	{"http.max_in_flight", 0, "HTTP APIs (wallet, uin-pool): requests served at once per instance; 0: 64 per CPU"},
	{"http.max_queue", 0, "HTTP APIs: requests that may wait for a slot; more are refused at once with 503 and Retry-After; 0: 4 x http.max_in_flight"},
	{"http.target_latency", 25 * time.Millisecond, "HTTP APIs: how long an admitted request should take; above it fewer requests are let in at once (down to 8), below it more (up to http.max_in_flight); the uin pool's wait for a refill is not counted"},
	{"http.max_wait", 5 * time.Millisecond, "HTTP APIs: the longest a request waits for a slot whatever its deadline; one that would wait longer is refused at once with 503 and Retry-After (a long queue only adds its wait to every answer)"},
	{"http.request_timeout", 2 * time.Second, "HTTP APIs: a request's deadline when its client sends no Request-Timeout header (a client's own is capped by it); a request that cannot start before it is refused with 503 at once, not queued to die"},
	{"http.max_conns", 10000, "HTTP APIs: open connections per instance; more wait in the kernel's backlog"},
	{"http.read_timeout", 10 * time.Second, "HTTP APIs: the whole request, body included, must arrive within this (headers within 5 s)"},
	{"http.idle_timeout", 60 * time.Second, "HTTP APIs: how long an idle keep-alive connection is kept"},
	{"wallet.http_addr", "127.0.0.1:8480", "`wallet`: address of the wallet HTTP API"},
	{"wallet.advertise", "", "`wallet`: URL other instances send reads of this instance's users to; empty: http://<wallet.http_addr>"},
	{"wallet.key_id", "k1", "`wallet`: id of the token signing key"},
	{"wallet.key_seed", "", "`wallet`: 32-byte Ed25519 seed of the signing key in base64, standard or URL-safe (`surge wallet keygen` prints one); empty generates one (tokens then die with the process)"},
	{"wallet.dir", "", "`wallet`: ledger Pebble directory; empty is a temporary one"},
	{"wallet.ledger_keys", 8 << 20, "`wallet`: keys (two per booking) the ledger's in-memory filter is sized for (10 bits each); past it, lookups of new orders fall back to Pebble more often"},
	{"wallet.batch_size", app.BatchSize, "`wallet`: concurrent grant requests coalesced into one batch (one signature per 256 tokens, one Redis round trip, one produce request)"},
	{"wallet.batch_linger", time.Millisecond, "`wallet`: how long a grant request waits for its batch to fill"},
	{"wallet.batchers", app.Batchers, "`wallet`: grant batches in flight (with wallet.batch_size, fewer and larger produce requests: the broker's cost is per request more than per record)"},
	{"wallet.gc_percent", app.GCPercent, "`wallet`: Go's GC target (GOGC) for the wallet process, unless the GOGC environment variable is set; intake makes short-lived garbage per grant, and 400 against Go's 100 took about a tenth off its CPU per grant for about twice the peak memory (set GOMEMLIMIT to bound it)"},
	{"wallet.rebuild_settle", 5 * time.Second, "`wallet`: budget and stock counters missing from Redis (it lost its data) are rebuilt from wallet.grants and wallet.tokens; the rebuild first waits this long, so grants that took from the lost counters are published by then (grants that need a missing counter answer 503 meanwhile)"},
	{"wallet.backup_redis", "", "`wallet`: backup Redis of the live total (dual write); empty: none"},
	{"wallet.namespace", "", "`wallet`: prefix of every wallet topic, group and Redis key (a unique one per test)"},
	{"wallet.app_keys", "", "`wallet`: activity services' request keys, app:keyid:secret,... (base64 secrets of >= 16 bytes, `surge wallet keygen`; several per app for rotation); empty: one generated for app demo and logged at start"},
	{"wallet.user_keys", "", "`wallet`: user-token keys, keyid:secret,... (the first issues, all verify); empty: one generated and logged at start"},
	{"wallet.require_keys", false, "`wallet`: refuse to start unless wallet.key_seed, wallet.app_keys and wallet.user_keys are all set (deployments: generated keys differ per instance and die with it)"},
	{"wallet.token_ttl", 24 * time.Hour, "`wallet token`: lifetime of an issued user token"},
	{"uin.namespace", "", "uin recycling: prefix of every uin topic, group and Redis key (shadow. for load tests)"},
	{"uin.dir", "", "uin recycling: Pebble stores live here; empty is a temporary directory"},
	{"uin.checkpoints", "1h,24h,168h,720h", "uin recycling: registration checkpoints after allocation (comma-separated durations)"},
	{"uin.spam_reports", 3, "uin recycling: spam reports that make a new registration spam"},
	{"uin.burst_messages", 50, "uin recycling: messages with at most one login that make a new registration spam"},
	{"uin.ban.abandoned", 24 * time.Hour, "uin recycling: ban before backup, abandoned registrations"},
	{"uin.ban.spam", 7 * 24 * time.Hour, "uin recycling: ban before backup, spam registrations"},
	{"uin.ban.inactive", 30 * 24 * time.Hour, "uin recycling: ban before backup, inactive stock accounts"},
	{"uin.cool_down.abandoned", 7 * 24 * time.Hour, "uin recycling: cool-down before release, abandoned"},
	{"uin.cool_down.spam", 30 * 24 * time.Hour, "uin recycling: cool-down before release, spam"},
	{"uin.cool_down.inactive", 180 * 24 * time.Hour, "uin recycling: cool-down before release, inactive"},
	{"uin.ticket_ttl", 24 * time.Hour, "uin recycling: a ticket's life past its next due step; every step renews it"},
	{"uin.ended_ticket_retention", 30 * 24 * time.Hour, "uin recycling: a finished ticket stays the uin's state this long (late duplicates recognised), then is dropped at the next rebuild; must exceed uin.ticket_ttl"},
	{"uin.controllers", 1, "uin recycling: recycle controller instances in this process"},
	{"uin.buckets", 1000, "uin recycling: central pool buckets (uin mod buckets)"},
	{"recon.http_addr", "127.0.0.1:8470", "`recon serve`: address of the operators' page (hours, mismatches with drill-down, dead letters, consumer lag, grants per minute)"},
	{"recon.keys", "", "`recon serve`: operators' keys for the page, name:secret,... (secret >= 32 chars; several for rotation); empty: one generated and logged at start"},
	{"uin.restore_wait", 60 * time.Second, "`uin restore`: how long to wait for the uin-restore service's answer"},
	{"uin.pool_addr", "127.0.0.1:8490", "`run uin-pool`: address of the allocation API"},
	{"uin.pool_keys", "", "`run uin-pool`: callers' API keys, name:secret,... (secret >= 32 chars; several for rotation); empty: one generated and logged at start"},
	{"uin.pool_low_water", 100000, "`run uin-pool`: central pool size under which the pool reports low"},
	{"uin.pool_local", 2000, "`run uin-pool`: uins a pool instance keeps leased locally (it refills below this)"},
	{"uin.pool_refill_wait", 2 * time.Second, "`run uin-pool`: how long a call waits for a refill of a dry local pool before answering 503 (only while the central pool has uins)"},
	{"uin.rebuild_settle", 5 * time.Second, "`run uin-pool`, `rebuild uin`: how long a rebuild of a pool Redis lost waits for changes made just before the loss to reach uin.pool"},
	{"uin.pool_lease_ttl", 10 * time.Second, "`run uin-pool`: a dead instance's lease returns to the central pool this long after its last heartbeat"},
	{"uin.min_age", 90 * 24 * time.Hour, "`uin classify`: accounts younger belong to the registration checks"},
	{"uin.inactive_for", 180 * 24 * time.Hour, "`uin classify`: no login (either source) nor usage for this long is inactive"},
	{"uin.limit", 0, "`uin classify`: most tickets requested in one run; 0 is no limit"},
	{"uin.accounts", 50000, "`uin demo`: synthetic accounts"},
	{"loadgen.users", 1_000_000, "`loadgen`: users (uins 1..N)"},
	{"loadgen.accounts", 1000, "`loadgen`: public accounts; followers per account follow a Zipf law"},
	{"loadgen.zipf", 1.1, "`loadgen`: Zipf exponent s (> 1) of followers per account rank"},
	{"loadgen.online", 0.6, "`loadgen`: share of users online at the start"},
	{"loadgen.churn", 20000, "`loadgen`: login/logout events per second while jobs run"},
	{"loadgen.jobs", 200, "`loadgen`: send jobs (mixed sources, sizes and priorities; 2% malformed)"},
	{"loadgen.seed", 1, "`loadgen`: random seed"},
	{"loadgen.timeout", 5 * time.Minute, "`loadgen`: give up waiting for jobs after this long"},
}

// secretKeys are never flags (a command line is visible to every user of
// the machine) and never printed: they come from the environment, the
// config file, or the file their _file twin names.
var secretKeys = map[string]bool{
	"kafka.sasl.password": true,
	"redis.password":      true,
	"clickhouse.password": true,
}

// replication is kafka.replication and kafka.min_insync_replicas.
func replication(v *viper.Viper) streams.Replication {
	return streams.Replication{Factor: int16(v.GetInt("kafka.replication")), MinInsync: v.GetInt("kafka.min_insync_replicas")}
}

// loadConfig parses flags for one command into a viper instance.
// commandKeys are the configuration keys (by prefix) each command takes
// as flags, beyond kafka.* and log.* which every command takes; a command
// not listed takes them all. Every key is still read from the config file
// and from SURGE_* environment variables by every command.
var commandKeys = map[string][]string{
	"embedded":     {"demo.", "clickhouse.", "redis.", "metrics.", "processor.", "sink.", "push.", "uin.", "loadgen."},
	"loadgen":      {"loadgen.", "push.", "metrics.", "processor."},
	"wallet":       {"wallet.", "redis.", "metrics.", "processor.", "http."},
	"wallet token": {"wallet."},
	"wallet sign":  {"wallet."},
	"uin":          {"uin.", "redis.", "clickhouse.", "metrics.", "processor.", "http."},
	"probe":        {"metrics.addr"},
	"push":         {"push.namespace"},
	"recon":        {"recon.", "clickhouse.", "metrics.", "processor.", "sink.", "wallet.namespace"},
	"topics":       {},
	"produce":      {},
	"consume":      {},
	"replay":       {},
	"rebuild":      {"wallet.", "redis."},
	"clickhouse":   {"clickhouse.", "metrics."},
}

// takesKey reports whether command name takes key as a flag.
func takesKey(name, key string) bool {
	prefixes, scoped := commandKeys[name]
	if !scoped || strings.HasPrefix(key, "kafka.") || strings.HasPrefix(key, "log.") {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

func loadConfig(name string, args []string, extra func(*pflag.FlagSet)) (*viper.Viper, *pflag.FlagSet, error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.String("config", "", "config file (YAML, TOML or JSON)")
	for _, o := range options {
		if !takesKey(name, o.key) || secretKeys[o.key] {
			continue
		}
		// pflag takes a back-quoted word of the help as the value's name.
		help := strings.ReplaceAll(o.help, "`", "'")
		switch d := o.def.(type) {
		case string:
			fs.String(o.key, d, help)
		case int:
			fs.Int(o.key, d, help)
		case time.Duration:
			fs.Duration(o.key, d, help)
		case float64:
			fs.Float64(o.key, d, help)
		case bool:
			fs.Bool(o.key, d, help)
		}
	}
	if extra != nil {
		extra(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: surge %s [flags]\n%s\nEvery configuration key (surge config) can also be set in the --config file or as SURGE_<KEY> (dots as _).\n",
			name, fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	v := viper.New()
	for _, o := range options {
		v.SetDefault(o.key, o.def)
	}
	v.SetEnvPrefix("SURGE")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if f, _ := fs.GetString("config"); f != "" {
		v.SetConfigFile(f)
		if err := v.ReadInConfig(); err != nil {
			return nil, nil, fmt.Errorf("config %s: %w", f, err)
		}
	}
	if err := v.BindPFlags(fs); err != nil {
		return nil, nil, err
	}
	if err := validateConfig(v, fs); err != nil {
		return nil, nil, err
	}
	return v, fs, nil
}

// validateConfig refuses what would otherwise be ignored or fall back to
// a default unseen: a key of the config file that no option has (a typo
// such as procesor.max_batch), and a value that does not parse as its
// option's type (SURGE_PROCESSOR_MAX_BATCH=abc) or level. Each error names
// the key and where its value came from.
func validateConfig(v *viper.Viper, fs *pflag.FlagSet) error {
	known := make(map[string]bool, len(options))
	for _, o := range options {
		known[o.key] = true
	}
	file, _ := fs.GetString("config")
	if file != "" {
		fv := viper.New()
		fv.SetConfigFile(file)
		if err := fv.ReadInConfig(); err != nil {
			return fmt.Errorf("config %s: %w", file, err)
		}
		for _, k := range fv.AllKeys() {
			if !known[k] {
				return fmt.Errorf("config %s: unknown key %q (surge config lists every key)", file, k)
			}
		}
	}
	from := func(key string) string {
		if f := fs.Lookup(key); f != nil && f.Changed {
			return "flag --" + key
		}
		env := "SURGE_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
		if _, ok := os.LookupEnv(env); ok {
			return "variable " + env
		}
		if file != "" {
			return "config " + file
		}
		return "default"
	}
	for _, o := range options {
		raw := strings.TrimSpace(v.GetString(o.key))
		var err error
		switch o.def.(type) {
		case int:
			_, err = strconv.Atoi(raw)
		case time.Duration:
			_, err = time.ParseDuration(raw)
		case bool:
			_, err = strconv.ParseBool(raw)
		case float64:
			_, err = strconv.ParseFloat(raw, 64)
		}
		if err == nil && o.key == "log.level" {
			var lvl slog.Level
			err = lvl.UnmarshalText([]byte(raw))
		}
		if o.key == "log.format" && raw != "text" && raw != "json" {
			return fmt.Errorf("log.format: %q is not text or json (%s; default text)", raw, from(o.key))
		}
		if err != nil {
			return fmt.Errorf("%s: %q is not a valid %s (%s; default %v)", o.key, raw, typeName(o.def), from(o.key), o.def)
		}
	}
	return nil
}

func typeName(def any) string {
	switch def.(type) {
	case int:
		return "whole number"
	case time.Duration:
		return "duration (such as 500ms, 10s, 2m)"
	case bool:
		return "true or false"
	case float64:
		return "number"
	}
	return "log level (debug, info, warn or error)"
}

// needKafka is the configured cluster, which must be set, checked once:
// a wrong password or an untrusted certificate stops the command within
// kafka.connect_timeout with the reason, instead of a silent retry loop.
func needKafka(ctx context.Context, v *viper.Viper) (streams.Cluster, error) {
	kc, err := connect.Kafka(v.GetString)
	if err != nil {
		return kc, err
	}
	if len(kc.Seeds) == 0 {
		return kc, fmt.Errorf("no brokers: set --kafka.brokers, SURGE_KAFKA_BROKERS or kafka.brokers in the config file")
	}
	if err := kc.Check(ctx, v.GetDuration("kafka.connect_timeout")); err != nil {
		return kc, err
	}
	addKafkaReadiness(kc)
	return kc, nil
}

// addKafkaReadiness makes /readyz ask the brokers once per probe.
func addKafkaReadiness(kc streams.Cluster) {
	var (
		once sync.Once
		cl   *kgo.Client
		err  error
	)
	health.Default.Add("kafka "+kc.String(), func(ctx context.Context) error {
		once.Do(func() { cl, err = kc.NewClient() })
		if err != nil {
			return err
		}
		return cl.Ping(ctx)
	})
}

// printConfig shows the effective configuration, sorted.
func printConfig(v *viper.Viper) {
	keys := make([]string, 0, len(options))
	for _, o := range options {
		keys = append(keys, o.key)
	}
	sort.Strings(keys)
	for _, k := range keys {
		val := v.Get(k)
		if secretKeys[k] && v.GetString(k) != "" {
			val = "(set, not shown)"
		}
		fmt.Printf("%-34s = %v\n", k, val)
	}
}

// kafkaOrEmbedded returns the configured cluster (checked as needKafka
// does) or, when none is, starts kfake in process (its data in
// kafka.embedded_dir). The returned stop closes what was started.
func kafkaOrEmbedded(ctx context.Context, v *viper.Viper, log *slog.Logger) (streams.Cluster, func(), error) {
	if len(connect.List(v.GetString, connect.KafkaKeys.Brokers)) > 0 {
		kc, err := needKafka(ctx, v)
		return kc, func() {}, err
	}
	k, err := embedded.StartKafka(embedded.DataDir(v.GetString("kafka.embedded_dir")))
	if err != nil {
		return streams.Cluster{}, nil, err
	}
	log.Info("embedded kafka (kfake) started", "brokers", k.Brokers())
	return streams.Seeds(k.Brokers()...), k.Close, nil
}

// kafkaAndRedis is kafkaOrEmbedded and redisOrEmbedded together, with one
// stop for both.
func kafkaAndRedis(ctx context.Context, v *viper.Viper, log *slog.Logger) (streams.Cluster, redis.UniversalClient, func(), error) {
	kc, stopKafka, err := kafkaOrEmbedded(ctx, v, log)
	if err != nil {
		return kc, nil, nil, err
	}
	rdb, stopRedis, err := redisOrEmbedded(ctx, v, log)
	if err != nil {
		stopKafka()
		return kc, nil, nil, err
	}
	return kc, rdb, func() { stopRedis(); stopKafka() }, nil
}

// redisAt is a client of the Redis at addrs with the configured mode,
// credentials and TLS (redis.*); nothing is sent yet.
func redisAt(v *viper.Viper, addrs ...string) (redis.UniversalClient, error) {
	o, err := connect.RedisOptions(v.GetString, addrs)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(o), nil
}

// needRedis is a client of redis.addr, which what needs, checked once: a
// refused password stops the command at once with the reason.
func needRedis(ctx context.Context, v *viper.Viper, what string) (redis.UniversalClient, error) {
	if v.GetString("redis.addr") == "" {
		return nil, fmt.Errorf("%s needs Redis: set --redis.addr, SURGE_REDIS_ADDR or redis.addr in the config file", what)
	}
	rdb, err := connect.Redis(ctx, v.GetString, v.GetDuration("redis.connect_timeout"))
	if err != nil {
		return nil, err
	}
	health.Default.Add("redis "+v.GetString("redis.addr"), func(ctx context.Context) error { return rdb.Ping(ctx).Err() })
	return rdb, nil
}

// redisOrEmbedded is needRedis or, when redis.addr is empty, a client of
// an in-process miniredis, stopped by the returned stop.
func redisOrEmbedded(ctx context.Context, v *viper.Viper, log *slog.Logger) (redis.UniversalClient, func(), error) {
	if v.GetString("redis.addr") != "" {
		rdb, err := needRedis(ctx, v, "this command")
		if err != nil {
			return nil, nil, err
		}
		return rdb, func() { _ = rdb.Close() }, nil
	}
	r, err := embedded.StartRedis()
	if err != nil {
		return nil, nil, err
	}
	log.Info("embedded redis (miniredis) started", "addr", r.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 32})
	return rdb, func() { _ = rdb.Close(); r.Close() }, nil
}
