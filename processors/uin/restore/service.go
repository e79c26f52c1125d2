package restore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Service answers restore requests (uin.restore-requests) on
// uin.restore-results, as `surge run uin-restore`. Each answer and the
// restored account's registration are written in the transaction that
// consumes the request; the Redis work before it is idempotent per request
// (Tool.Restore), so a request consumed again after a crash restores onto
// the same uin and is answered once.
type Service struct {
	cfg  Config
	tool *Tool
}

// Config configures the restore service.
type Config struct {
	streams.Env
	Accounts *account.Store // accounts in Redis (required)
	Pool     *pool.Central  // the central pool a restore takes a uin from (required)
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() { c.Env.EnsureDefaults() }

// New returns the service; Run starts it.
func New(cfg Config) *Service {
	cfg.EnsureDefaults()
	return &Service{cfg: cfg, tool: &Tool{Kafka: cfg.Kafka, Namespace: cfg.Namespace,
		Accounts: cfg.Accounts, Pool: cfg.Pool, Now: cfg.Now}}
}

// Tool is the restore the service runs for each request.
func (s *Service) Tool() *Tool { return s.tool }

// Run serves until ctx ends.
func (s *Service) Run(ctx context.Context, opts ...streams.Option) error {
	ns := s.tool.Namespace
	opts = append([]streams.Option{
		streams.Kafka(s.tool.Kafka),
		streams.Declare(Spec, ns),
		streams.DeadLetterTopic(ns + schemas.TopicDeadLetter),
	}, opts...)
	r, err := streams.New("uin-restore", streams.Typed(s.handle), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func (s *Service) handle(ctx context.Context, in *kgo.Record, req *pb.RestoreRequest, out *streams.Output) error {
	switch {
	case req.Username == "":
		return streams.Reject("restore request without a username", nil)
	case req.RequestId == "":
		return streams.Reject("restore request without a request id", nil)
	case string(in.Key) != req.Username:
		return streams.Reject(fmt.Sprintf("restore request keyed %q, not by its username %q", in.Key, req.Username), nil)
	}
	now := s.cfg.Now()
	res, err := s.tool.Restore(ctx, req.RequestId, req.Username)
	answer := &pb.RestoreResult{RequestId: req.RequestId, Username: req.Username, OldUin: uint64(res.OldUin), AtMs: now.UnixMilli()}
	switch {
	case errors.Is(err, ErrNoBackup), errors.Is(err, ErrLive), errors.Is(err, pool.ErrExhausted):
		answer.Error = err.Error() // an answer, not a failure of the service
		s.cfg.Log.Info("uin-restore: refused", "username", req.Username, "request", req.RequestId, "why", err)
	case err != nil:
		return err // Redis or the broker: retried
	default:
		answer.Uin, answer.Reused, answer.Friends = uint64(res.Uin), res.Reused, uint32(res.Friends)
		out.Emit(s.tool.Registration(res, now))
		s.cfg.Log.Info("uin-restore: restored", "username", req.Username, "uin", res.Uin, "reused", res.Reused, "request", req.RequestId)
	}
	return out.EmitMsg(s.tool.Namespace+schemas.TopicRestoreResults, []byte(req.Username), answer)
}

// Request is the record that asks for username's restore.
func Request(ns, requestID, username, by string, at time.Time) *kgo.Record {
	rec, err := streams.NewRecord(ns+schemas.TopicRestoreReqs, []byte(username),
		&pb.RestoreRequest{RequestId: requestID, Username: username, RequestedBy: by, AtMs: at.UnixMilli()})
	if err != nil {
		panic(err) // a request always encodes
	}
	return rec
}

// AwaitResult reads uin.restore-results from the offsets in from (taken
// before the request was published; a partition it lacks from its start)
// until the answer to requestID.
func AwaitResult(ctx context.Context, kc streams.Cluster, ns, requestID string, from map[int32]int64) (*pb.RestoreResult, error) {
	topic := ns + schemas.TopicRestoreResults
	adm, err := kc.NewClient()
	if err != nil {
		return nil, err
	}
	ends, err := kadm.NewClient(adm).ListEndOffsets(ctx, topic)
	adm.Close()
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %s: %w", topic, err)
	}
	start := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) { start[o.Partition] = kgo.NewOffset().At(from[o.Partition]) })
	cl, err := kc.NewClient(kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("restore: no answer to request %s: %w", requestID, err)
		}
		var found *pb.RestoreResult
		f.EachRecord(func(r *kgo.Record) {
			var res pb.RestoreResult
			if streams.Decode(r, &res) == nil && res.RequestId == requestID {
				found = &res
			}
		})
		if found != nil {
			return found, nil
		}
	}
}
