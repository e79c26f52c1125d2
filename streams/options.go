package streams

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/streams/health"
	"surge/streams/metrics"
)

// Guarantee is the delivery guarantee a processor runs with.
type Guarantee int

const (
	// AtLeastOnce flushes outputs, then commits offsets; downstream must be idempotent.
	AtLeastOnce Guarantee = iota
	// ExactlyOnce commits outputs and offsets in one Kafka transaction.
	ExactlyOnce
)

func (g Guarantee) String() string {
	if g == ExactlyOnce {
		return "exactly-once"
	}
	return "at-least-once"
}

// ParseGuarantee reads "exactly-once" or "at-least-once".
func ParseGuarantee(s string) (Guarantee, error) {
	switch s {
	case "exactly-once", "eos":
		return ExactlyOnce, nil
	case "at-least-once", "alo":
		return AtLeastOnce, nil
	}
	return 0, fmt.Errorf("streams: unknown guarantee %q (exactly-once or at-least-once)", s)
}

type config struct {
	name           string
	cluster        Cluster
	group          string
	inputs         []string
	guarantee      Guarantee
	instanceID     string
	maxBatch       int
	maxRecordBytes int
	deadLetter     string
	maxAttempts    int
	backoffMin     time.Duration
	backoffMax     time.Duration
	txnTimeout     time.Duration
	deliveryTO     time.Duration
	shutdownTO     time.Duration
	lagEvery       time.Duration
	registry       *metrics.Registry
	logger         *slog.Logger
	clientOpts     []kgo.Opt
	onCommit       func(in, out int)
	static         bool
	health         *health.Checks
	onBatchEnd     func(committed bool)
	onRetry        func()
	beforeBatch    func(ctx context.Context, recs []*kgo.Record)
	beforeCommit   func(ctx context.Context) error
	afterBatch     func(ctx context.Context, out *Output) error
	onIdle         func(ctx context.Context)
	onSession      func(ctx context.Context) error
	fault          func(FaultPoint)
	readyChecks    []func() error
	spec           *Spec  // Declare: the topics it may consume and produce
	namespace      string // prefix of every topic in spec
}

func defaults(name string) config {
	host, _ := os.Hostname()
	if host == "" {
		host = "local"
	}
	return config{
		name:           name,
		group:          name,
		guarantee:      AtLeastOnce,
		instanceID:     host,
		maxBatch:       10000,
		maxRecordBytes: 1 << 20,
		deadLetter:     schemas.TopicDeadLetter,
		maxAttempts:    5,
		backoffMin:     100 * time.Millisecond,
		backoffMax:     5 * time.Second,
		txnTimeout:     20 * time.Second,
		deliveryTO:     2 * time.Minute,
		shutdownTO:     30 * time.Second,
		lagEvery:       10 * time.Second,
		registry:       metrics.Default,
		health:         health.Default,
		logger:         slog.Default(),
	}
}

// Option configures a Runner.
type Option func(*config)

// Kafka sets the cluster the runner connects to.
func Kafka(c Cluster) Option { return func(cfg *config) { cfg.cluster = c } }

// Inputs sets the topics consumed.
func Inputs(topics ...string) Option { return func(c *config) { c.inputs = topics } }

// Group sets the consumer group (default: the processor name).
func Group(g string) Option { return func(c *config) { c.group = g } }

// WithGuarantee chooses exactly-once or at-least-once.
func WithGuarantee(g Guarantee) Option { return func(c *config) { c.guarantee = g } }

// InstanceID names this instance; with exactly-once it forms the
// transactional ID, so it must be stable across restarts of one instance
// (a restart then fences its own zombie and aborts its open transaction at
// once) and unique among live instances. Default: the host name.
func InstanceID(id string) Option { return func(c *config) { c.instanceID = id } }

// MaxBatch bounds the records processed per batch (and per transaction).
func MaxBatch(n int) Option { return func(c *config) { c.maxBatch = n } }

// MaxRecordBytes dead-letters inputs whose value is larger.
func MaxRecordBytes(n int) Option { return func(c *config) { c.maxRecordBytes = n } }

// DeadLetterTopic overrides the dead-letter topic.
func DeadLetterTopic(t string) Option { return func(c *config) { c.deadLetter = t } }

// MaxAttempts is how often a transient handler error is retried before the
// record is dead-lettered.
func MaxAttempts(n int) Option { return func(c *config) { c.maxAttempts = n } }

// Backoff bounds the exponential back-off between retries and reconnects.
func Backoff(min, max time.Duration) Option {
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

// TransactionTimeout sets the broker-side timeout of a transaction.
func TransactionTimeout(d time.Duration) Option { return func(c *config) { c.txnTimeout = d } }

// DeliveryTimeout bounds how long a produce may retry (a broker gone away)
// before the batch fails and the session restarts from the last commit.
func DeliveryTimeout(d time.Duration) Option { return func(c *config) { c.deliveryTO = d } }

// ShutdownTimeout bounds finishing the batch in flight at shutdown.
func ShutdownTimeout(d time.Duration) Option { return func(c *config) { c.shutdownTO = d } }

// LagEvery is how often the group's lag is read from the broker for every
// partition this instance holds (default 10 s): surge_consumer_lag then
// has a series for a partition that never had a record too, not only for
// those a fetch returned records of.
func LagEvery(d time.Duration) Option { return func(c *config) { c.lagEvery = d } }

// Metrics sets the registry (default metrics.Default).
func Metrics(r *metrics.Registry) Option { return func(c *config) { c.registry = r } }

// Logger sets the logger.
func Logger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// ClientOpts passes extra franz-go options (TLS, SASL, tuning).
func ClientOpts(opts ...kgo.Opt) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// OnCommit is called after each committed batch with its input and output
// counts (progress reporting).
func OnCommit(fn func(in, out int)) Option { return func(c *config) { c.onCommit = fn } }

// Health sets where the runner's readiness check is added (default
// health.Default, served at /readyz).
func Health(c *health.Checks) Option { return func(cfg *config) { cfg.health = c } }

// StaticMembership joins the group with a static group.instance.id (the
// instance ID): a restarted instance takes its partitions back at once
// instead of waiting for the session timeout. Static members do not leave
// the group on shutdown, so use it for restarts in place, not for scaling.
func StaticMembership() Option { return func(c *config) { c.static = true } }

// OnBatchEnd is called once per batch after it ends: committed is false when
// it was aborted and will be consumed again. A processor that caches state
// stages its changes during the batch and applies them here only on commit,
// so a replayed batch sees the state it saw the first time.
func OnBatchEnd(fn func(committed bool)) Option { return func(c *config) { c.onBatchEnd = fn } }

// FaultPoint names a step of a batch's commit, where a crash test kills
// the process (Faults).
type FaultPoint int

// The steps, in the order a batch takes them.
const (
	// FaultBeforeProduce: the handler ran, nothing is produced yet.
	FaultBeforeProduce FaultPoint = iota
	// FaultAfterProduce: every output is acknowledged by the brokers
	// (inside the open transaction, with exactly-once), nothing committed.
	FaultAfterProduce
	// FaultBeforeCommit: immediately before the transaction ends (or the
	// offsets are committed), after any wait for the previous end.
	FaultBeforeCommit
	// FaultDuringCommit: called on its own goroutine as the commit starts,
	// so a kill from it lands while the commit's requests are in flight.
	FaultDuringCommit
)

func (f FaultPoint) String() string {
	return [...]string{"before_produce", "after_produce", "before_commit", "during_commit"}[f]
}

// Faults calls hook at each step of every batch's commit: crash tests kill
// the process there to prove that a crash at any step loses and
// duplicates nothing. Not for production use.
func Faults(hook func(FaultPoint)) Option { return func(c *config) { c.fault = hook } }

// OnRetry is called before a batch whose handler failed part-way (a
// transient error) is processed again from its first record: a processor
// that staged changes for the failed attempt drops them here.
func OnRetry(fn func()) Option { return func(c *config) { c.onRetry = fn } }

// BeforeBatch is called with a batch's records before the handler sees
// any of them: the place for work that is pure per record and worth doing
// in parallel (signature checks), whose results the handler then reads.
func BeforeBatch(fn func(ctx context.Context, recs []*kgo.Record)) Option {
	return func(c *config) { c.beforeBatch = fn }
}

// OnIdle is called on the processing goroutine when no record has arrived
// for idlePoll: the place for work on the processor's state that must not
// run beside the handler and must not wait for traffic (rebuilding a
// partition nobody writes to, so reads of it can be served).
// Several OnIdle functions run in the order given.
func OnIdle(fn func(ctx context.Context)) Option {
	return func(c *config) {
		if prev := c.onIdle; prev != nil {
			c.onIdle = func(ctx context.Context) { prev(ctx); fn(ctx) }
			return
		}
		c.onIdle = fn
	}
}

// OnSessionStart is called when a session starts, before it consumes; in
// an exactly-once session, after it has initialised its producer id, which
// fenced every earlier holder of its transactional id. A processor that
// must see what was written under its identity before it works (the push
// executor reads the planner's revocations) reads it here: nothing more
// can be written under that identity during the session without fencing
// it, which ends the session. An error ends the session (it is retried).
func OnSessionStart(fn func(ctx context.Context) error) Option {
	return func(c *config) { c.onSession = fn }
}

// ReadyWhen adds a condition to the runner's readiness (/readyz): while
// check returns an error, the processor is not ready and says why.
func ReadyWhen(check func() error) Option {
	return func(c *config) { c.readyChecks = append(c.readyChecks, check) }
}

// idlePoll is how long a poll waits for records before OnIdle runs.
const idlePoll = 250 * time.Millisecond

// AfterBatch is called once the handler has seen every record of a batch,
// with the batch's output: the place to emit what the batch as a whole
// changed (one changelog record per key touched, not one per input). It is
// part of processing: an error retries the batch like a handler's
// (OnRetry, then every record again), so what it emits is never doubled.
func AfterBatch(fn func(ctx context.Context, out *Output) error) Option {
	return func(c *config) { c.afterBatch = fn }
}

// BeforeCommit is called after a batch is processed and before its outputs
// and offsets commit; an error retries the batch (with back-off), so a sink
// that writes its rows here never commits offsets for rows it did not write.
func BeforeCommit(fn func(ctx context.Context) error) Option {
	return func(c *config) { c.beforeCommit = fn }
}
