// Package ctr is the push-ctr processor: it counts the clicks of every
// send job (push.clicks) against the job's targets (from
// push.job-transitions) and publishes each job's click-through on the
// compacted push.job-clicks, keyed like its inputs by job id. The planner
// reads it (directory) to set an account's daily job quota by its last
// delivery's click-through rate (seed: quota follows the last delivery's
// effect).
//
// State is one JobClicks per job, restored from push.job-clicks (its own
// changelog) when a partition is assigned; a batch emits the final record
// of every job it touched, in the transaction with its input offsets, so
// a click is counted once across crashes.
package ctr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Config configures a push-ctr instance: it needs only its Env.
type Config struct {
	streams.Env
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() { c.Env.EnsureDefaults() }

// Processor is one push-ctr instance.
type Processor struct {
	cfg     Config
	restore *streams.Restorer

	mu     sync.Mutex
	jobs   map[string]*pb.JobClicks // committed
	staged map[string]*pb.JobClicks // touched by the batch in flight
}

// New returns a processor.
func New(cfg Config) *Processor {
	cfg.EnsureDefaults()
	p := &Processor{cfg: cfg, jobs: map[string]*pb.JobClicks{}, staged: map[string]*pb.JobClicks{}}
	p.restore = streams.NewRestorer(cfg.Kafka, p.clear, p.applyChangelog, cfg.Topic(schemas.TopicJobClicks))
	return p
}

// Group is the consumer group.
func (p *Processor) Group() string { return p.cfg.Namespace + "push-ctr" }

// Run processes until ctx ends.
func (p *Processor) Run(ctx context.Context, opts ...streams.Option) error {
	opts = append([]streams.Option{
		streams.Kafka(p.cfg.Kafka),
		streams.Declare(Spec, p.cfg.Namespace),
		streams.DeadLetterTopic(p.cfg.Namespace + schemas.TopicDeadLetter),
		// clicks, transitions and the changelog are co-partitioned by job id
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer())),
		streams.AfterBatch(p.emit),
		streams.OnBatchEnd(p.batchEnd),
		streams.OnRetry(func() { p.batchEnd(false) }),
		p.restore.Option(),
	}, opts...)
	route, err := streams.Route(Spec, p.cfg.Namespace, p.inputs()...)
	if err != nil {
		return err
	}
	r, err := streams.New("push-ctr", p.guarded(route), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func (p *Processor) clear(ps map[int32]bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, _ := schemas.TopicByName(schemas.TopicJobClicks)
	for id := range p.jobs {
		if ps[int32(streams.PartitionFor([]byte(id), int(t.Partitions)))] {
			delete(p.jobs, id)
		}
	}
	return nil
}

func (p *Processor) applyChangelog(r *kgo.Record) error {
	var jc pb.JobClicks
	if streams.Decode(r, &jc) != nil || jc.JobId == "" {
		return nil
	}
	p.mu.Lock()
	p.jobs[jc.JobId] = &jc
	p.mu.Unlock()
	return nil
}

// job returns the batch's copy of a job's counts.
func (p *Processor) job(id string) *pb.JobClicks {
	if j, ok := p.staged[id]; ok {
		return j
	}
	j := &pb.JobClicks{JobId: id}
	if c, ok := p.jobs[id]; ok {
		j = proto.Clone(c).(*pb.JobClicks)
	}
	p.staged[id] = j
	return j
}

// inputs are the processor's inputs, each with its handler (Spec.Inputs).
func (p *Processor) inputs() []streams.Input {
	return []streams.Input{
		streams.On(schemas.TopicClicks, p.onClick),
		streams.On(schemas.TopicJobTransitions, p.onTransition),
	}
}

// guarded runs route once the record's partition is restored, with the
// lock held.
func (p *Processor) guarded(route streams.Handler) streams.Handler {
	return func(ctx context.Context, in *kgo.Record, out *streams.Output) error {
		if err := p.restore.Ensure(ctx, in.Partition); err != nil {
			return err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return route(ctx, in, out)
	}
}

func (p *Processor) onClick(_ context.Context, in *kgo.Record, c *pb.ClickEvent, _ *streams.Output) error {
	switch {
	case c.JobId == "":
		return streams.Reject("click without a job id", errors.New("job_id is empty"))
	case c.Uin == 0 || c.Uin > math.MaxUint32:
		return streams.Reject("bad uin", fmt.Errorf("uin %d is not a 32-bit account number", c.Uin))
	case string(in.Key) != c.JobId:
		return streams.Reject("click keyed wrong", fmt.Errorf("key %q, job %q: key clicks by job id", in.Key, c.JobId))
	}
	j := p.job(c.JobId)
	if j.AccountId == 0 {
		j.AccountId = c.AccountId
	}
	// A click flood (or a replayed client) cannot lift the rate over 1.
	if j.Targets == 0 || j.Clicks < j.Targets {
		j.Clicks++
	}
	return nil
}

func (p *Processor) onTransition(_ context.Context, _ *kgo.Record, t *pb.JobTransition, _ *streams.Output) error {
	if t.JobId == "" {
		return nil // the planner's; nothing to count
	}
	if t.Job == nil && t.Targets == 0 && t.To != pb.JobState_COMPLETED {
		return nil
	}
	j := p.job(t.JobId)
	if t.Job != nil {
		j.AccountId = t.Job.AccountId
	}
	if t.Targets > 0 {
		j.Targets = t.Targets
	}
	if t.To == pb.JobState_COMPLETED {
		j.CompletedAtMs = t.AtMs
	}
	if j.Targets > 0 {
		j.Clicks = min(j.Clicks, j.Targets)
	}
	return nil
}

// emit writes the final state of every job the batch touched.
func (p *Processor) emit(_ context.Context, out *streams.Output) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, j := range p.staged {
		if err := out.EmitMsg(p.cfg.Namespace+schemas.TopicJobClicks, []byte(id), j); err != nil {
			return err
		}
	}
	return nil
}

func (p *Processor) batchEnd(committed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if committed {
		for id, j := range p.staged {
			p.jobs[id] = j
		}
	}
	clear(p.staged)
}

// Job is a job's committed counts (tests, operators).
func (p *Processor) Job(id string) (*pb.JobClicks, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	j, ok := p.jobs[id]
	return j, ok
}
