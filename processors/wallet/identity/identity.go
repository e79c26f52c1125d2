// Package identity is the wallet's unified account: one actID per person
// across the platform's apps, phone number first (seed 002). The account
// system publishes every app account with its phone number on
// wallet.identities (compacted, keyed "<app>:<user_id>"); the
// wallet-identities processor keeps, for each app account, its actID in
// Redis, where the API answers GET /v1/identities/{app}/{user} for the
// activity services that build order numbers from actIDs.
//
// The actID is derived, not allocated: from the phone number when the
// account has one, so the accounts of one phone in every app are one
// actID with no coordination between instances or apps; from the app
// account otherwise. Derivation needs no state, so a rebuild or another
// region computes the same actIDs.
package identity

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ActID is the person's actID: "p" and a digest of the phone number when
// there is one, else "a" and a digest of the app account. 20 characters
// of the digest (100 bits) keep collisions out of reach for billions of
// people; the letters and digits keep it usable inside order numbers.
func ActID(phone, app, userID string) string {
	if phone != "" {
		return "p" + digest("phone\x00"+phone)
	}
	return "a" + digest("app\x00"+app+"\x00"+userID)
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return lowerBase32.EncodeToString(h[:])[:20]
}

// Key is an app account's record key on wallet.identities.
func Key(app, userID string) string { return app + ":" + userID }

// Config configures the wallet-identities processor.
type Config struct {
	streams.Env
	Redis redis.UniversalClient // where the actIDs are kept (required)
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() { c.Env.EnsureDefaults() }

// Processor keeps each app account's actID in Redis.
type Processor struct {
	cfg Config
}

// New returns the processor; Run starts it.
func New(cfg Config) *Processor {
	cfg.EnsureDefaults()
	return &Processor{cfg: cfg}
}

// Redis holds a cache of wallet.identities: each app account's actID with
// the offset of the record it came from (a hash: a, o), written only over
// an older one, so the live consumer and a rebuild reading the topic from
// its start can write side by side in any order and the newest record
// wins. A generation marker (wid:gen) says the cache is whole; when Redis
// lost it, the processor reads the compacted topic from its start again
// and sets the marker, and the resolver answers ErrRebuilding (503) for an
// account it does not find meanwhile, not "unknown".

// setScript writes an account's actID (ARGV[2]; "" for a tombstone, kept
// ARGV[3] ms so an older record replayed late cannot bring it back) from
// the record at offset ARGV[1], unless a newer record wrote it.
var setScript = redis.NewScript(`
local o = tonumber(redis.call('HGET', KEYS[1], 'o') or '-1')
if tonumber(ARGV[1]) <= o then return 0 end
redis.call('HSET', KEYS[1], 'a', ARGV[2], 'o', ARGV[1])
if ARGV[2] == '' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) else redis.call('PERSIST', KEYS[1]) end
return 1`)

// tombstoneTTL is how long an unlinked account's tombstone is kept.
const tombstoneTTL = 7 * 24 * time.Hour

func genKey(ns string) string { return ns + "wid:gen" }

// Run processes wallet.identities until ctx ends, and rebuilds the cache
// from the topic's start whenever its generation marker is missing. It is
// at least once: writing an account's actID again changes nothing.
func (p *Processor) Run(ctx context.Context, opts ...streams.Option) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kept := make(chan error, 1)
	go func() { kept <- p.keep(ctx) }()
	err := p.run(ctx, opts...)
	cancel()
	<-kept
	return err
}

// keep rebuilds the cache when its marker is missing: at start, then
// every 2 s.
func (p *Processor) keep(ctx context.Context) error {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		if n, err := p.cfg.Redis.Exists(ctx, genKey(p.cfg.Namespace)).Result(); err == nil && n == 0 {
			if err := p.Rebuild(ctx); err != nil && ctx.Err() == nil {
				p.cfg.Log.Error("identities: not rebuilt; trying again", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Rebuild reads wallet.identities from its start into Redis (each record
// written unless a newer one was) and then sets the generation marker.
func (p *Processor) Rebuild(ctx context.Context) error {
	began, n := time.Now(), 0
	topic := p.cfg.Topic(schemas.TopicIdentities)
	err := streams.ReadToEnd(ctx, p.cfg.Kafka, topic, func(r *kgo.Record) error {
		n++
		err := p.handle(ctx, r, nil)
		if streams.IsReject(err) {
			return nil // the live consumer dead-letters it
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := p.cfg.Redis.Set(ctx, genKey(p.cfg.Namespace), began.UnixMilli(), 0).Err(); err != nil {
		return err
	}
	p.cfg.Log.Info("identities: rebuilt from the topic", "topic", topic, "records", n, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

func (p *Processor) run(ctx context.Context, opts ...streams.Option) error {
	opts = append([]streams.Option{
		streams.Kafka(p.cfg.Kafka),
		streams.Declare(Spec, p.cfg.Namespace),
		streams.DeadLetterTopic(p.cfg.Topic(schemas.TopicDeadLetter)),
		streams.Logger(p.cfg.Log), streams.Metrics(p.cfg.Metrics),
	}, opts...)
	r, err := streams.New("wallet-identities", p.handle, opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// redisKey is an account's hash (the actID and the offset it came from).
func redisKey(ns, app, userID string) string { return ns + "wid2:" + Key(app, userID) }

func (p *Processor) handle(ctx context.Context, in *kgo.Record, _ *streams.Output) error {
	if in.Value == nil { // a tombstone: the account is gone
		app, user, ok := strings.Cut(string(in.Key), ":")
		if !ok {
			return streams.Reject(fmt.Sprintf("identity tombstone keyed %q, not app:user_id", in.Key), nil)
		}
		return setScript.Run(ctx, p.cfg.Redis, []string{redisKey(p.cfg.Namespace, app, user)}, in.Offset, "", tombstoneTTL.Milliseconds()).Err()
	}
	var l pb.IdentityLink
	if err := streams.Decode(in, &l); err != nil {
		return err
	}
	switch {
	case l.App == "" || l.UserId == "" || strings.Contains(l.App, ":"):
		return streams.Reject(fmt.Sprintf("identity without an app or user id (app %q, user %q)", l.App, l.UserId), nil)
	case string(in.Key) != Key(l.App, l.UserId):
		return streams.Reject(fmt.Sprintf("identity keyed %q, not by its account %q", in.Key, Key(l.App, l.UserId)), nil)
	}
	return setScript.Run(ctx, p.cfg.Redis, []string{redisKey(p.cfg.Namespace, l.App, l.UserId)}, in.Offset, ActID(l.Phone, l.App, l.UserId), 0).Err()
}

// ErrUnknown is an app account the account system has not published.
var ErrUnknown = errors.New("identity: unknown app account")

// ErrRebuilding answers an account not found while the cache is being
// rebuilt from wallet.identities (its generation marker is missing).
var ErrRebuilding = errors.New("identity: the identities are being rebuilt from wallet.identities")

// Resolver answers an app account's actID from what the processor kept.
type Resolver struct {
	rdb redis.UniversalClient
	ns  string
}

// NewResolver reads the actIDs kept under namespace ns.
func NewResolver(rdb redis.UniversalClient, ns string) *Resolver { return &Resolver{rdb: rdb, ns: ns} }

// ActID is the actID of app's account userID.
func (r *Resolver) ActID(ctx context.Context, app, userID string) (string, error) {
	v, err := r.rdb.HGet(ctx, redisKey(r.ns, app, userID), "a").Result()
	if errors.Is(err, redis.Nil) || err == nil && v == "" {
		if n, err := r.rdb.Exists(ctx, genKey(r.ns)).Result(); err != nil {
			return "", err
		} else if n == 0 {
			return "", ErrRebuilding
		}
		return "", fmt.Errorf("%w %s", ErrUnknown, Key(app, userID))
	}
	return v, err
}

// Link is the record that publishes an app account and its phone (the
// account system's; tests and `surge produce` build the same).
func Link(ns string, l *pb.IdentityLink) (*kgo.Record, error) {
	return streams.NewRecord(ns+schemas.TopicIdentities, []byte(Key(l.App, l.UserId)), l)
}
