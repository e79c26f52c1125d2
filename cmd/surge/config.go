package main

import (
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"surge/processors/wallet/stack"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"surge/streams/embedded"
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
	{"kafka.replication", 1, "replication factor for topics created by `topics create` and `embedded`"},
	{"processor.guarantee", "", "override a processor's delivery guarantee: exactly-once or at-least-once"},
	{"processor.instance_id", "", "stable id of this instance (transactional id); default the host name, with -2, -3... for further instances of the same service on this host (a lock file per slot in the temporary directory; a restart takes its slot back)"},
	{"processor.max_batch", 10000, "records per batch / transaction"},
	{"processor.max_record_bytes", 1 << 20, "larger inputs are dead-lettered"},
	{"processor.max_attempts", 5, "transient failures per record before it is dead-lettered"},
	{"processor.session_timeout", time.Duration(0), "consumer group session timeout: how soon a killed instance's partitions move to the others (0: the client default, 45s)"},
	{"processor.static_membership", false, "join with processor.instance_id as a static member: a restarted instance takes its partitions back at once (restarts in place, not scaling)"},
	{"processor.shutdown_timeout", 30 * time.Second, "how long shutdown may take to finish the batch in flight"},
	{"redis.addr", "", "Redis for the shared online bitmap; empty: an in-process miniredis in `embedded`, no mirror in `run`"},
	{"redis.prefix", "online:", "key prefix of the online bitmap shards (use shadow.online: for load tests)"},
	{"sink.max_batch", 100000, "rows per sink insert: ClickHouse wants few large inserts (overrides processor.max_batch for sink-*)"},
	{"sink.tasks", 2, "tasks per sink: members of its group in this process, each inserting its own batches at once (Kafka Connect's tasks.max)"},
	{"clickhouse.dsn", "", "ClickHouse server DSN (clickhouse://host:9000/db, or http://host:8123/db); empty uses embedded chDB"},
	{"clickhouse.chdb_dir", "", "chDB data directory in embedded mode; empty is a temporary one"},
	{"clickhouse.chdb_connections", 0, "chDB queries and inserts that may run at once; 0 is the number of CPUs (at most 8)"},
	{"metrics.addr", "127.0.0.1:9464", "address of the Prometheus /metrics endpoint; empty disables it"},
	{"log.level", "info", "debug, info, warn or error"},
	{"demo.users", 200000, "`embedded`: users in the generated login traffic; 0 serves until interrupted"},
	{"demo.seed", 1, "`embedded`: random seed of the generated traffic"},
	{"push.dir", "", "mass push: number packages and Pebble stores live here; empty is a temporary directory"},
	{"push.namespace", "", "mass push: prefix of every push topic (shadow. for load-test traffic)"},
	{"push.executors", 2, "mass push: executors started in process (`loadgen` on the embedded broker)"},
	{"push.executor_name", "", "`run push-executor`: this executor's name (its unit queue is push.units.<name>); empty: processor.instance_id, else the host name"},
	{"push.unit_size", 1 << 18, "mass push: uins per dispatched unit"},
	{"push.max_backlog", 8, "mass push: units an executor may hold not yet done"},
	{"push.min_lead", 15 * time.Minute, "mass push: a scheduled job starts at least this long after creation"},
	{"push.mirror_threshold", 10_000_000, "mass push: accounts with this many followers use the local fan-list mirror"},
	{"push.executor_capacity", 0, "`run push-executor`: uins this executor takes at once (it reports it; the planner keeps its units in flight within it, at least one); 0: only push.max_backlog limits it"},
	{"push.drain_timeout", time.Minute, "`run push-executor`: on SIGTERM the executor drains (takes nothing new, finishes its units, exits 0) for at most this long"},
	{"push.planner_checkpoint_every", 30 * time.Second, "mass push: how often the active planner checkpoints its memory to push.planner-checkpoints (a restore replays only the transitions after it); 0: never, every restore replays all"},
	{"wallet.config", "", "`wallet`: activity tree file (YAML/TOML/JSON), reloaded on change; empty uses a built-in demo tree"},
	{"wallet.http_addr", "127.0.0.1:8480", "`wallet`: address of the wallet HTTP API"},
	{"wallet.advertise", "", "`wallet`: URL other instances send reads of this instance's users to; empty: http://<wallet.http_addr>"},
	{"wallet.key_id", "k1", "`wallet`: id of the token signing key"},
	{"wallet.key_seed", "", "`wallet`: base64 32-byte Ed25519 seed of the signing key; empty generates one (tokens then die with the process)"},
	{"wallet.dir", "", "`wallet`: ledger Pebble directory; empty is a temporary one"},
	{"wallet.ledger_keys", 8 << 20, "`wallet`: keys (two per booking) the ledger's in-memory filter is sized for (10 bits each); past it, lookups of new orders fall back to Pebble more often"},
	{"wallet.batch_size", stack.BatchSize, "`wallet`: concurrent grant requests coalesced into one batch (one signature per 256 tokens, one Redis round trip, one produce request)"},
	{"wallet.batch_linger", time.Millisecond, "`wallet`: how long a grant request waits for its batch to fill"},
	{"wallet.batchers", stack.Batchers, "`wallet`: grant batches in flight (with wallet.batch_size, fewer and larger produce requests: the broker's cost is per request more than per record)"},
	{"wallet.gc_percent", stack.GCPercent, "`wallet`: Go's GC target (GOGC) for the wallet process, unless the GOGC environment variable is set; intake makes short-lived garbage per grant, and 400 against Go's 100 took about a tenth off its CPU per grant for about twice the peak memory (set GOMEMLIMIT to bound it)"},
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

// loadConfig parses flags for one command into a viper instance.
// commandKeys are the configuration keys (by prefix) each command takes
// as flags, beyond kafka.* and log.* which every command takes; a command
// not listed takes them all. Every key is still read from the config file
// and from SURGE_* environment variables by every command.
var commandKeys = map[string][]string{
	"embedded":     {"demo.", "clickhouse.", "redis.", "metrics.", "processor.", "sink.", "push.", "uin.", "loadgen."},
	"loadgen":      {"loadgen.", "push.", "metrics.", "processor."},
	"wallet":       {"wallet.", "redis.", "metrics.", "processor."},
	"wallet token": {"wallet."},
	"wallet sign":  {"wallet."},
	"uin":          {"uin.", "redis.", "clickhouse.", "metrics.", "processor."},
	"push":         {"push.namespace"},
	"recon":        {"recon.", "clickhouse.", "metrics.", "processor.", "sink.", "wallet.namespace"},
	"topics":       {},
	"produce":      {},
	"consume":      {},
	"replay":       {},
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
		if !takesKey(name, o.key) {
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
	return v, fs, nil
}

func brokers(v *viper.Viper) []string {
	var out []string
	for _, b := range strings.Split(v.GetString("kafka.brokers"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// printConfig shows the effective configuration, sorted.
func printConfig(v *viper.Viper) {
	keys := make([]string, 0, len(options))
	for _, o := range options {
		keys = append(keys, o.key)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("%-28s = %v\n", k, v.Get(k))
	}
}

// brokersOrEmbedded returns the configured brokers or, when none are,
// starts kfake in process (its data in kafka.embedded_dir). The returned
// stop closes what was started.
func brokersOrEmbedded(v *viper.Viper, log *slog.Logger) ([]string, func(), error) {
	if bs := brokers(v); len(bs) > 0 {
		return bs, func() {}, nil
	}
	k, err := embedded.StartKafka(embedded.DataDir(v.GetString("kafka.embedded_dir")))
	if err != nil {
		return nil, nil, err
	}
	log.Info("embedded kafka (kfake) started", "brokers", k.Brokers())
	return k.Brokers(), k.Close, nil
}

// kafkaAndRedis is brokersOrEmbedded and redisOrEmbedded together, with one
// stop for both.
func kafkaAndRedis(v *viper.Viper, log *slog.Logger) ([]string, string, func(), error) {
	bs, stopKafka, err := brokersOrEmbedded(v, log)
	if err != nil {
		return nil, "", nil, err
	}
	addr, stopRedis, err := redisOrEmbedded(v, log)
	if err != nil {
		stopKafka()
		return nil, "", nil, err
	}
	return bs, addr, func() { stopRedis(); stopKafka() }, nil
}

// redisOrEmbedded returns redis.addr or, when empty, starts miniredis.
func redisOrEmbedded(v *viper.Viper, log *slog.Logger) (string, func(), error) {
	if addr := v.GetString("redis.addr"); addr != "" {
		return addr, func() {}, nil
	}
	r, err := embedded.StartRedis()
	if err != nil {
		return "", nil, err
	}
	log.Info("embedded redis (miniredis) started", "addr", r.Addr())
	return r.Addr(), r.Close, nil
}
