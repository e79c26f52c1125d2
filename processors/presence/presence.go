// Package presence turns login and logout events into the online state of
// every user: a roaring bitmap over the 32-bit uin space (the seed keeps 4.2
// billion bits in shared memory; roaring holds the same set in far less for
// realistic online counts). It emits a record on push.presence only when a
// user's state changes, so that compacted topic is the latest state per uin
// and the bitmap is rebuilt from it on start (Restore).
package presence

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
)

// Processor holds the online bitmap. The bitmap is a cache: changes made
// while a batch is in flight are staged and applied only when it commits.
type Processor struct {
	mu       sync.RWMutex
	online   *roaring.Bitmap
	staged   map[uint32]bool
	outTopic string
	mirror   *RedisMirror
}

// WithMirror shares the committed bitmap through Redis; the mirror's
// writer runs until ctx ends.
func (p *Processor) WithMirror(ctx context.Context, m *RedisMirror) *Processor {
	p.mirror = m
	m.start(ctx, p.Online)
	return p
}

// New returns a processor writing state changes to outTopic.
func New(outTopic string) *Processor {
	return &Processor{online: roaring.New(), staged: map[uint32]bool{}, outTopic: outTopic}
}

// Handle is the streams handler.
func (p *Processor) Handle() streams.Handler {
	return streams.Typed(func(_ context.Context, in *kgo.Record, ev *surgev1.LoginEvent, out *streams.Output) error {
		if ev.Uin > schemas.MaxUin {
			return streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", ev.Uin), nil)
		}
		uin := uint32(ev.Uin)
		if p.isOnline(uin) == ev.Online {
			return nil // no change, nothing to say
		}
		p.staged[uin] = ev.Online
		return out.EmitMsg(p.outTopic, schemas.UinKey(uin), ev)
	})
}

func (p *Processor) isOnline(uin uint32) bool {
	if v, ok := p.staged[uin]; ok {
		return v
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.online.Contains(uin)
}

// BatchEnd applies staged changes on commit and drops them on abort.
func (p *Processor) BatchEnd(committed bool) {
	if committed {
		p.mu.Lock()
		for uin, on := range p.staged {
			if on {
				p.online.Add(uin)
			} else {
				p.online.Remove(uin)
			}
		}
		p.mu.Unlock()
		if p.mirror != nil {
			p.mirror.enqueue(p.staged)
		}
	}
	clear(p.staged)
}

// IsOnline reports the committed state of uin.
func (p *Processor) IsOnline(uin uint32) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.online.Contains(uin)
}

// Online returns a copy of the committed online bitmap.
func (p *Processor) Online() *roaring.Bitmap {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.online.Clone()
}

// Restore rebuilds the bitmap by reading the presence topic from the start
// to its current end. It returns the number of records read.
func (p *Processor) Restore(ctx context.Context, brokers []string, topic string) (int, error) {
	n := 0
	err := streams.ReadToEnd(ctx, brokers, topic, func(r *kgo.Record) error {
		var ev surgev1.LoginEvent
		if err := streams.Decode(r, &ev); err != nil || ev.Uin > schemas.MaxUin {
			return nil // the processor never wrote such a record; ignore
		}
		n++
		if ev.Online {
			p.online.Add(uint32(ev.Uin))
		} else {
			p.online.Remove(uint32(ev.Uin))
		}
		return nil
	})
	return n, err
}

// Run restores the bitmap, then processes logins until ctx ends. With a
// mirror, Redis is first rewritten from the restored bitmap.
func (p *Processor) Run(ctx context.Context, brokers []string, opts ...streams.Option) error {
	if _, err := p.Restore(ctx, brokers, p.outTopic); err != nil {
		return fmt.Errorf("presence: restore: %w", err)
	}
	if p.mirror != nil {
		p.mirror.signal() // the restored bitmap goes to Redis in full
	}
	opts = append([]streams.Option{
		streams.Brokers(brokers...),
		// behind the namespace of its output (push-presence: push.namespace)
		streams.Declare(Spec, strings.TrimSuffix(p.outTopic, schemas.TopicPresence)),
		streams.OnBatchEnd(p.BatchEnd),
	}, opts...)
	r, err := streams.New("presence", p.Handle(), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
