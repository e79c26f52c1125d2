// Package app wires one wallet instance: the grant intake and its
// batcher, the ledger, the live total and the HTTP API, over the wallet's
// topics. `surge wallet`, the wallet benchmark and the API tests build it
// the same way; each part stays usable alone (the ledger's tests drive
// broken producers and lossy Redis into the intake directly).
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/api"
	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/internal/counter"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/token"
	"surge/schemas"
	"surge/streams"
	"surge/streams/admission"
	"surge/streams/metrics"
)

// TotalKey is the Redis hash of the live total's per-partition sums
// (behind the namespace).
const TotalKey = "wallet:total:partitions"

// GCPercent is the Go GC target a wallet process runs with (GOGC; Go's
// default is 100). Intake allocates a few short-lived objects per grant
// and little stays live, so the collector ran often for little: at 400
// the intake took about a tenth less CPU per grant, and the wallet bench's
// peak memory went from 0.6 to 1.5 GB (bench/wallet-notes.md). GOMEMLIMIT
// bounds the heap where memory is tight.
const GCPercent = 400

// BatchSize and Batchers are the grant batching `surge wallet` runs with
// (wallet.batch_size, wallet.batchers): four batches of up to 1024 in
// flight. Against eight of 512, the broker's CPU per grant fell by about a
// sixth (fewer produce requests and larger partition batches) and grants
// through the API rose in each of five alternating runs
// (bench/wallet-notes.md); two of 2048 left the machine idle between
// batches.
const (
	BatchSize = 1024
	Batchers  = 4
)

// Topics are the wallet's topics behind namespace ns.
func Topics(ns string) []schemas.Topic {
	return schemas.Namespaced(ns, schemas.TopicGrants, schemas.TopicTokens, schemas.TopicLedger,
		schemas.TopicWithdrawals, schemas.TopicWithdrawResult, schemas.TopicPackets, schemas.TopicIdentities, schemas.TopicDeadLetter)
}

// TopicNames are the names of Topics(ns) (tests create them with their
// own partition counts).
func TopicNames(ns string) []string {
	var names []string
	for _, t := range Topics(ns) {
		names = append(names, t.Name)
	}
	return names
}

// Options configure an instance. Kafka, Source, Keys, Redis, Producer
// and Dir are required; the rest have defaults.
type Options struct {
	Kafka     streams.Cluster
	Namespace string
	Dir       string // the ledger's Pebble directory
	Source    *config.Source
	Keys      *token.Keyring // token signing
	Redis     redis.UniversalClient
	// BackupRedis receives the live total too (dual write); nil: none.
	BackupRedis redis.UniversalClient
	Producer    *kgo.Client
	// Apps and Users authenticate the API; both nil turn it off
	// (benchmarks of its cost only).
	Apps  *auth.Apps
	Users *auth.Users
	// Advertise is the URL the other instances send this one's users'
	// reads to; InstanceID its stable id (static membership).
	Advertise  string
	InstanceID string
	// Batching of concurrent grant requests (0: requests go to the intake
	// one by one).
	BatchSize   int
	BatchLinger time.Duration
	Batchers    int
	// ExpectedKeys sizes the ledger's key filter (0: its default).
	ExpectedKeys int
	// NoTotal leaves the live total out (tests of other parts).
	NoTotal bool
	// RebuildSettle is how long a rebuild of the budget and stock
	// counters waits for grants in flight before it reads the topics
	// (0: the intake's default, 5 s).
	RebuildSettle time.Duration
	Log           *slog.Logger
	Metrics       *metrics.Registry
}

// Stack is one wallet instance.
type Stack struct {
	Intake  *grant.Intake
	Batcher *grant.Batcher // nil without batching
	Ledger  *ledger.Ledger
	Total   *counter.Counter // nil with NoTotal
	API     *api.Server
	// Identities keeps each app account's actID for the API
	// (wallet-identities, on wallet.identities).
	Identities *identity.Processor

	opts Options
}

// New builds an instance; nothing runs until Run.
func New(o Options) (*Stack, error) {
	switch {
	case len(o.Kafka.Seeds) == 0, o.Source == nil, o.Keys == nil, o.Redis == nil, o.Producer == nil:
		return nil, errors.New("wallet stack: Kafka, Source, Keys, Redis and Producer are required")
	case o.Dir == "":
		return nil, errors.New("wallet stack: the ledger needs a directory")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = metrics.Default
	}
	w := &Stack{opts: o}
	if !o.NoTotal {
		w.Total = counter.New(o.Redis, o.BackupRedis, o.Namespace+TotalKey, o.Log)
		w.Total.FollowSwitch(func() bool { return o.Source.Tree().Degraded(guard.CounterPrimary) })
	}
	env := streams.Env{Kafka: o.Kafka, Namespace: o.Namespace, Log: o.Log, Metrics: o.Metrics}
	w.Intake = grant.New(grant.Config{Env: env, Source: o.Source, Keys: o.Keys, Redis: o.Redis, Producer: o.Producer,
		RebuildSettle: o.RebuildSettle})
	w.Ledger = ledger.New(ledger.Config{Env: env, Dir: o.Dir, Source: o.Source, Keys: o.Keys,
		Tokens: w.Intake.Tokens(), ExpectedKeys: o.ExpectedKeys,
		Advertise: o.Advertise, Total: w.Total, InstanceID: o.InstanceID})
	w.Identities = identity.New(identity.Config{Env: env, Redis: o.Redis})
	apiCfg := api.Config{Env: env, Intake: w.Intake, Ledger: w.Ledger, Counter: w.Total, Producer: o.Producer,
		Redis: o.Redis, Source: o.Source, Advertise: o.Advertise, Apps: o.Apps, Users: o.Users,
		Identities: identity.NewResolver(o.Redis, o.Namespace)}
	if o.BatchSize > 0 {
		w.Batcher = grant.NewBatcher(w.Intake, o.BatchSize, o.BatchLinger, max(o.Batchers, 1))
		apiCfg.Batcher = w.Batcher
	}
	w.API = api.New(apiCfg)
	return w, nil
}

// EnsureTopics creates the wallet's topics that do not exist.
func (w *Stack) EnsureTopics(ctx context.Context, rep streams.Replication) error {
	if err := streams.EnsureTopics(ctx, w.opts.Producer, rep, Topics(w.opts.Namespace)...); err != nil {
		return fmt.Errorf("wallet: topics: %w", err)
	}
	return nil
}

// Start follows the withdrawal answers and starts the live total: what
// the API needs before it serves.
func (w *Stack) Start(ctx context.Context) error {
	// Budget and stock counters missing from Redis (a new deployment, or
	// a Redis that lost its data) are rebuilt from the topics first.
	if err := w.Intake.EnsureCounters(ctx); err != nil {
		return err
	}
	if err := w.API.FollowResults(ctx); err != nil {
		return err
	}
	if w.Total != nil {
		go w.Total.Run(ctx, time.Second)
	}
	return nil
}

// Run books until ctx ends (the ledger, with the runner options) and
// keeps the app accounts' actIDs (wallet-identities). The first of them
// to fail stops the other.
func (w *Stack) Run(ctx context.Context, opts ...streams.Option) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := make(chan error, 1)
	go func() {
		// The runner options too: the instance id and static membership,
		// so a restarted wallet takes its place in this group at once
		// (without them it waited out its dead self's session: 7-9 s).
		idOpts := append(append([]streams.Option(nil), opts...), streams.Logger(w.opts.Log.With("processor", "wallet-identities")))
		err := w.Identities.Run(ctx, idOpts...)
		if err != nil && ctx.Err() == nil {
			cancel()
		}
		ids <- err
	}()
	err := w.Ledger.Run(ctx, opts...)
	cancel()
	if ierr := <-ids; err == nil && ierr != nil && !errors.Is(ierr, context.Canceled) {
		err = fmt.Errorf("wallet-identities: %w", ierr)
	}
	return err
}

// Handler is the HTTP API behind its admission gate, counted in the
// request metrics as the clients see it.
func (w *Stack) Handler(gate admission.Config) http.Handler {
	gate.Metrics = w.opts.Metrics
	return admission.New(gate).Instrumented("wallet", w.API.Handler())
}

// Close stops the batcher (after Run returned).
func (w *Stack) Close() {
	if w.Batcher != nil {
		w.Batcher.Close()
	}
}
