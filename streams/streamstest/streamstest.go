// Package streamstest runs Kafka tests against every configured backend:
// always the embedded kfake broker, and a real Apache Kafka broker when
// SURGE_TEST_KAFKA names one (scripts/test.sh starts it). With
// SURGE_TEST_REQUIRE_REAL=1 a missing real broker fails the test instead of
// skipping it, so CI cannot pass on kfake alone.
package streamstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/streams"
	"surge/streams/connect"
	"surge/streams/embedded"
)

// Backend is one Kafka to test against.
type Backend struct {
	Name  string
	Kafka streams.Cluster
	Real  bool
}

// Mode says how Each, EachStack and EachRedis run their test.
type Mode int

const (
	// Concurrently is the default: the test runs in parallel with the
	// package's other parallel tests (Each and EachStack), and its
	// backends' subtests side by side. Each backend has its own broker or
	// its own topics (Unique) and its own Redis or keys, and these tests
	// mostly wait on the network, so this cuts the suite's time.
	Concurrently Mode = iota
	// InTurn runs the test alone and its backends one after the other,
	// for a test that shares something else, such as one ClickHouse
	// table it truncates.
	InTurn
)

// parallel marks a test parallel unless modes ask for InTurn.
func parallel(t *testing.T, modes []Mode) {
	for _, m := range modes {
		if m == InTurn {
			return
		}
	}
	t.Parallel()
}

// Each runs fn as a subtest per backend. Unless modes say InTurn, the
// test runs in parallel with the package's other parallel tests, and its
// backends side by side.
func Each(t *testing.T, fn func(t *testing.T, b Backend), modes ...Mode) {
	t.Helper()
	parallel(t, modes)
	t.Run("kfake", func(t *testing.T) {
		parallel(t, modes)
		k, err := embedded.StartKafka()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		fn(t, Backend{Name: "kfake", Kafka: streams.Seeds(k.Brokers()...)})
	})
	t.Run("kafka", func(t *testing.T) {
		parallel(t, modes)
		fn(t, RealBroker(t))
	})
}

// RealBroker is the real broker backend; without one the test is skipped,
// or fails under SURGE_TEST_REQUIRE_REAL=1.
func RealBroker(t testing.TB) Backend {
	t.Helper()
	b, ok := Real()
	if !ok {
		if os.Getenv("SURGE_TEST_REQUIRE_REAL") == "1" {
			t.Fatal("SURGE_TEST_REQUIRE_REAL=1 but SURGE_TEST_KAFKA is not set")
		}
		t.Skip("no real broker: set SURGE_TEST_KAFKA (scripts/kafka.sh start)")
	}
	return b
}

// Real returns the real broker backend if one is configured.
func Real() (Backend, bool) {
	addr := os.Getenv("SURGE_TEST_KAFKA")
	if addr == "" {
		return Backend{}, false
	}
	return Backend{Name: "kafka", Kafka: streams.Seeds(strings.Split(addr, ",")...), Real: true}, true
}

// Secured is the real broker's SASL_SSL listener as a client configures
// it: the SURGE_KAFKA_* keys scripts/kafka.sh writes to the file that
// SURGE_TEST_KAFKA_SECURE names (brokers, CA file, SCRAM user, password
// file). Without it the test is skipped, or fails under
// SURGE_TEST_REQUIRE_REAL=1.
func Secured(t testing.TB) map[string]string {
	t.Helper()
	return envFile(t, "SURGE_TEST_KAFKA_SECURE")
}

// KafkaCluster is the three-broker cluster of the tests
// (scripts/kafka-cluster.sh): SURGE_KAFKA_BROKERS and KAFKA_CLUSTER_SCRIPT,
// which kills and restarts its nodes, from the file SURGE_TEST_KAFKA_CLUSTER
// names.
func KafkaCluster(t testing.TB) map[string]string {
	t.Helper()
	return envFile(t, "SURGE_TEST_KAFKA_CLUSTER")
}

// Unique returns name with a random suffix, so tests never share topics or groups.
func Unique(name string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return name + "-" + hex.EncodeToString(b[:])
}

// Client returns a plain client closed with the test.
func Client(t testing.TB, kc streams.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kc.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopics creates fresh topics with the given partition count.
func CreateTopics(t testing.TB, kc streams.Cluster, partitions int32, names ...string) {
	t.Helper()
	cl := Client(t, kc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tps := make([]schemas.Topic, len(names))
	for i, n := range names {
		tps[i] = schemas.Topic{Name: n, Partitions: partitions, Retention: 24 * time.Hour}
	}
	if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, tps...); err != nil {
		t.Fatal(err)
	}
}

// ProduceSync produces records and fails the test on any error.
func ProduceSync(t testing.TB, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// ReadN reads topic from the start with the given isolation until n records
// arrived or the timeout passed, and returns what it read; it keeps reading
// for settle afterwards so that extra (duplicate) records are seen too.
func ReadN(t testing.TB, kc streams.Cluster, topic string, committedOnly bool, n int, timeout, settle time.Duration) []*kgo.Record {
	t.Helper()
	return ReadUntil(t, kc, topic, committedOnly, func(recs []*kgo.Record) bool { return len(recs) >= n }, timeout, settle)
}

// ReadUntil is ReadN for records that carry many items each (batches):
// it reads until enough says the records read so far are enough.
func ReadUntil(t testing.TB, kc streams.Cluster, topic string, committedOnly bool, enough func([]*kgo.Record) bool, timeout, settle time.Duration) []*kgo.Record {
	t.Helper()
	return ReadTopicsUntil(t, kc, []string{topic}, committedOnly, enough, timeout, settle)
}

// ReadTopicsUntil is ReadUntil over several topics through one reader.
func ReadTopicsUntil(t testing.TB, kc streams.Cluster, topics []string, committedOnly bool, enough func([]*kgo.Record) bool, timeout, settle time.Duration) []*kgo.Record {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committedOnly {
		iso = kgo.ReadCommitted()
	}
	cl := Client(t, kc, kgo.ConsumeTopics(topics...), kgo.FetchIsolationLevel(iso),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var out []*kgo.Record
	deadline := time.Now().Add(timeout)
	var settleUntil time.Time
	for {
		now := time.Now()
		if !settleUntil.IsZero() && now.After(settleUntil) || settleUntil.IsZero() && now.After(deadline) {
			return out
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		f := cl.PollFetches(ctx)
		cancel()
		out = append(out, f.Records()...)
		if settleUntil.IsZero() && enough(out) {
			settleUntil = time.Now().Add(settle)
		}
	}
}

// RedisClient returns a client for the real redis-server of the tests, if
// SURGE_TEST_REDIS is set; with SURGE_TEST_REQUIRE_REAL=1 its absence fails.
func RedisClient(t testing.TB) (*redis.Client, bool) {
	addr := os.Getenv("SURGE_TEST_REDIS")
	if addr == "" {
		if os.Getenv("SURGE_TEST_REQUIRE_REAL") == "1" {
			t.Fatal("SURGE_TEST_REQUIRE_REAL=1 but SURGE_TEST_REDIS is not set")
		}
		return nil, false
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb, true
}

// EachStack runs fn twice: on kfake with miniredis, and on the real broker
// with the real redis-server; in parallel as Each is.
func EachStack(t *testing.T, fn func(t *testing.T, b Backend, rdb *redis.Client), modes ...Mode) {
	t.Helper()
	parallel(t, modes)
	t.Run("kfake+miniredis", func(t *testing.T) {
		parallel(t, modes)
		k, err := embedded.StartKafka()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(k.Close)
		rdb := redis.NewClient(miniredisOptions(liveMiniredis(t).Addr()))
		t.Cleanup(func() { rdb.Close() })
		fn(t, Backend{Name: "kfake", Kafka: streams.Seeds(k.Brokers()...)}, rdb)
	})
	t.Run("kafka+redis", func(t *testing.T) {
		parallel(t, modes)
		b, ok := Real()
		rdb, rok := RedisClient(t)
		if !ok || !rok {
			if os.Getenv("SURGE_TEST_REQUIRE_REAL") == "1" {
				t.Fatal("SURGE_TEST_REQUIRE_REAL=1 but SURGE_TEST_KAFKA or SURGE_TEST_REDIS is not set")
			}
			t.Skip("no real broker or redis: set SURGE_TEST_KAFKA and SURGE_TEST_REDIS")
		}
		fn(t, b, rdb)
	})
}

// EachStackOnEveryRedis is EachStack and, beside it, the real broker
// with the TLS redis-server of an ACL user and with the three-master Redis
// Cluster (RedisOf): for the tests that show a system keeps its guarantees
// on every shape of Redis a platform runs.
func EachStackOnEveryRedis(t *testing.T, fn func(t *testing.T, b Backend, rdb redis.UniversalClient), modes ...Mode) {
	t.Helper()
	EachStack(t, func(t *testing.T, b Backend, rdb *redis.Client) { fn(t, b, rdb) }, modes...)
	for _, shape := range []string{"secure", "cluster"} {
		t.Run("kafka+redis-"+shape, func(t *testing.T) {
			parallel(t, modes)
			fn(t, RealBroker(t), RedisOf(t, shape))
		})
	}
}

// miniredisOptions are a client's of the in-process miniredis. It runs
// Lua in Go on the test's own cores: a pipeline of many scripts can take
// seconds while the whole suite runs, and go-redis sends a timed-out
// pipeline again, which is not what the tests mean to test (a real
// server runs the same pipeline in milliseconds).
func miniredisOptions(addr string) *redis.Options {
	return &redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
}

// liveMiniredis is a miniredis whose clock moves with the wall clock, so
// keys expire as on a real server: miniredis otherwise only expires keys
// on FastForward, and a lock left by a killed process would live forever.
func liveMiniredis(t *testing.T) *miniredis.Miniredis {
	m := miniredis.RunT(t)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		const step = 50 * time.Millisecond
		tick := time.NewTicker(step)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				m.FastForward(step)
			}
		}
	}()
	return m
}

// EachRedis runs fn on miniredis and on each real Redis of the tests:
// the plain redis-server (SURGE_TEST_REDIS), the TLS server with an ACL
// user (SURGE_TEST_REDIS_SECURE) and the three-master Redis Cluster
// (SURGE_TEST_REDIS_CLUSTER), the last two named by the client.env files
// scripts/redis.sh writes. Under SURGE_TEST_REQUIRE_REAL=1 a missing one
// fails the test.
func EachRedis(t *testing.T, fn func(t *testing.T, rdb redis.UniversalClient), modes ...Mode) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		parallel(t, modes)
		rdb := redis.NewClient(miniredisOptions(miniredis.RunT(t).Addr()))
		t.Cleanup(func() { rdb.Close() })
		fn(t, rdb)
	})
	t.Run("redis", func(t *testing.T) {
		parallel(t, modes)
		rdb, ok := RedisClient(t)
		if !ok {
			t.Skip("no real redis: set SURGE_TEST_REDIS (scripts/redis.sh start)")
		}
		fn(t, rdb)
	})
	for _, shape := range []string{"secure", "cluster"} {
		t.Run("redis-"+shape, func(t *testing.T) {
			parallel(t, modes)
			fn(t, RedisOf(t, shape))
		})
	}
}

// RedisEnv is the SURGE_REDIS_* configuration of the test Redis of the
// given shape ("secure" or "cluster"), from the client.env file the
// variable SURGE_TEST_REDIS_<SHAPE> names; skipped without it, or failed
// under SURGE_TEST_REQUIRE_REAL=1.
func RedisEnv(t testing.TB, shape string) map[string]string {
	t.Helper()
	name := "SURGE_TEST_REDIS_" + strings.ToUpper(shape)
	return envFile(t, name)
}

// RedisOf is a client of the test Redis of the given shape, configured as
// a service would be (connect.RedisOptions over RedisEnv), closed with the
// test.
func RedisOf(t testing.TB, shape string) redis.UniversalClient {
	t.Helper()
	rdb, err := connect.Redis(context.Background(), connect.Vars(RedisEnv(t, shape)), 30*time.Second)
	if err != nil {
		t.Fatalf("redis %s: %v", shape, err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// envFile reads KEY=VALUE lines from the file variable names.
func envFile(t testing.TB, variable string) map[string]string {
	t.Helper()
	path := os.Getenv(variable)
	if path == "" {
		if os.Getenv("SURGE_TEST_REQUIRE_REAL") == "1" {
			t.Fatalf("SURGE_TEST_REQUIRE_REAL=1 but %s is not set", variable)
		}
		t.Skipf("%s is not set (scripts/kafka.sh and scripts/redis.sh start write the files it names)", variable)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v", variable, err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			env[k] = v
		}
	}
	return env
}
