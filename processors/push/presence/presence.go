// Package presence turns login and logout events into the online state of
// every user: a roaring bitmap over the 32-bit uin space (the seed keeps 4.2
// billion bits in shared memory; roaring holds the same set in far less for
// realistic online counts). It emits a record on push.presence only when a
// user's state changes, so that compacted topic is the latest state per uin
// and the bitmap is rebuilt from it on start (Restore).
package presence

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
)

// Processor holds the online bitmap, one per partition of push.login
// (co-partitioned with push.presence): an instance owns some partitions,
// and a partition's bitmap is rebuilt from push.presence whenever it is
// assigned (streams.Restorer), so an instance taking a partition over never
// decides "no change" on what it saw before the previous owner's writes.
// The bitmaps are a cache: changes made while a batch is in flight are
// staged and applied only when it commits.
type Processor struct {
	cfg     Config
	mu      sync.RWMutex
	parts   map[int32]*roaring.Bitmap
	staged  map[uint32]staged
	mirror  *RedisMirror
	restore *streams.Restorer // nil unless Run: a bare Handle keeps its start-up state
}

type staged struct {
	partition int32
	online    bool
}

// WithMirror shares the committed bitmap through Redis; the mirror's
// writer runs until ctx ends.
func (p *Processor) WithMirror(ctx context.Context, m *RedisMirror) *Processor {
	p.mirror = m
	m.start(ctx, p.Online)
	return p
}

// Config configures the presence processor.
type Config struct {
	streams.Env
	// Output is the topic of state changes (default push.presence in the
	// namespace; logins come from push.login in the namespace).
	Output string
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Output == "" {
		c.Output = c.Topic(schemas.TopicPresence)
	}
}

// New returns a processor.
func New(cfg Config) *Processor {
	cfg.EnsureDefaults()
	return &Processor{cfg: cfg, parts: map[int32]*roaring.Bitmap{}, staged: map[uint32]staged{}}
}

// Handle is the streams handler.
func (p *Processor) Handle() streams.Handler {
	return streams.Typed(func(ctx context.Context, in *kgo.Record, ev *surgev1.LoginEvent, out *streams.Output) error {
		if ev.Uin > schemas.MaxUin {
			return streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", ev.Uin), nil)
		}
		uin := uint32(ev.Uin)
		if key := schemas.UinKey(uin); !bytes.Equal(in.Key, key) {
			// Its partition would not be the uin's: another instance may
			// own the uin's state.
			return streams.Reject(fmt.Sprintf("login keyed wrong: key %x, want the uin %d as 4 bytes big-endian (%x)", in.Key, uin, key), nil)
		}
		if p.restore != nil {
			if err := p.restore.Ensure(ctx, in.Partition); err != nil {
				return err
			}
		}
		if p.isOnline(in.Partition, uin) == ev.Online {
			return nil // no change, nothing to say
		}
		p.staged[uin] = staged{in.Partition, ev.Online}
		return out.EmitMsg(p.cfg.Output, schemas.UinKey(uin), ev)
	})
}

func (p *Processor) isOnline(partition int32, uin uint32) bool {
	if v, ok := p.staged[uin]; ok {
		return v.online
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	b := p.parts[partition]
	return b != nil && b.Contains(uin)
}

// part returns partition's bitmap, creating it (mu held).
func (p *Processor) part(partition int32) *roaring.Bitmap {
	b := p.parts[partition]
	if b == nil {
		b = roaring.New()
		p.parts[partition] = b
	}
	return b
}

// BatchEnd applies staged changes on commit and drops them on abort.
func (p *Processor) BatchEnd(committed bool) {
	if committed {
		p.mu.Lock()
		changes := make(map[uint32]bool, len(p.staged))
		for uin, st := range p.staged {
			if st.online {
				p.part(st.partition).Add(uin)
			} else {
				p.part(st.partition).Remove(uin)
			}
			changes[uin] = st.online
		}
		p.mu.Unlock()
		if p.mirror != nil {
			p.mirror.enqueue(changes)
		}
	}
	clear(p.staged)
}

// IsOnline reports the committed state of uin.
func (p *Processor) IsOnline(uin uint32) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, b := range p.parts {
		if b.Contains(uin) {
			return true
		}
	}
	return false
}

// Online returns a copy of the committed online bitmap.
func (p *Processor) Online() *roaring.Bitmap {
	p.mu.RLock()
	defer p.mu.RUnlock()
	parts := make([]*roaring.Bitmap, 0, len(p.parts))
	for _, b := range p.parts {
		parts = append(parts, b)
	}
	return roaring.FastOr(parts...)
}

// Restore rebuilds the bitmap by reading the presence topic from the start
// to its current end. It returns the number of records read.
func (p *Processor) Restore(ctx context.Context) (int, error) {
	n := 0
	err := streams.ReadToEnd(ctx, p.cfg.Kafka, p.cfg.Output, func(r *kgo.Record) error {
		if p.applyChange(r) {
			n++
		}
		return nil
	})
	return n, err
}

// applyChange applies one push.presence record to its partition's bitmap.
func (p *Processor) applyChange(r *kgo.Record) bool {
	var ev surgev1.LoginEvent
	if err := streams.Decode(r, &ev); err != nil || ev.Uin > schemas.MaxUin {
		return false // the processor never wrote such a record; ignore
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ev.Online {
		p.part(r.Partition).Add(uint32(ev.Uin))
	} else {
		p.part(r.Partition).Remove(uint32(ev.Uin))
	}
	return true
}

// clearPartitions forgets the partitions about to be rebuilt.
func (p *Processor) clearPartitions(ps map[int32]bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for part := range ps {
		delete(p.parts, part)
	}
	return nil
}

// Run restores the bitmap, then processes logins until ctx ends. With a
// mirror, Redis is first rewritten from the restored bitmap.
func (p *Processor) Run(ctx context.Context, opts ...streams.Option) error {
	ns, kc := p.cfg.Namespace, p.cfg.Kafka
	if _, err := streams.CoPartitioned(ctx, kc, ns+schemas.TopicLogin, p.cfg.Output); err != nil {
		return fmt.Errorf("presence: %w", err)
	}
	p.restore = streams.NewRestorer(kc, p.clearPartitions, func(r *kgo.Record) error { p.applyChange(r); return nil }, p.cfg.Output)
	// A partition nobody wrote to since this start-up read is not read again
	// when it is assigned.
	if err := p.restore.Baseline(ctx); err != nil {
		return fmt.Errorf("presence: restore: %w", err)
	}
	if _, err := p.Restore(ctx); err != nil {
		return fmt.Errorf("presence: restore: %w", err)
	}
	if p.mirror != nil {
		p.mirror.signal() // the restored bitmap goes to Redis in full
	}
	opts = append([]streams.Option{
		streams.Kafka(kc),
		streams.Declare(Spec, ns),
		streams.Logger(p.cfg.Log), streams.Metrics(p.cfg.Metrics),
		streams.OnBatchEnd(p.BatchEnd),
		p.restore.Option(),
	}, opts...)
	r, err := streams.New("presence", p.Handle(), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
