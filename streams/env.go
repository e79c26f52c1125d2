package streams

import (
	"log/slog"
	"time"

	"surge/streams/metrics"
)

// Env is what the process that runs a processor gives it: the brokers, the
// namespace its topics carry, where it logs and counts, and its clock.
// Every processor's Config embeds it, so every processor is built the same
// way, New(Config), and fills what was left out in one place: its Config's
// EnsureDefaults, which starts with Env.EnsureDefaults.
type Env struct {
	Kafka Cluster
	// Namespace prefixes every topic and consumer group, so several
	// deployments (or tests) can share one cluster.
	Namespace string
	// Replication of the topics a processor creates as it runs (an
	// executor's unit queue); zero takes it from the cluster.
	Replication Replication
	Log         *slog.Logger
	Metrics     *metrics.Registry
	Now         func() time.Time
}

// EnsureDefaults fills the logger, registry and clock left out.
func (e *Env) EnsureDefaults() {
	if e.Log == nil {
		e.Log = slog.Default()
	}
	if e.Metrics == nil {
		e.Metrics = metrics.NewRegistry()
	}
	if e.Now == nil {
		e.Now = time.Now
	}
}

// Topic is a registry topic's name in this namespace.
func (e *Env) Topic(name string) string { return e.Namespace + name }
