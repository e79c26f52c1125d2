package tracker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// The tracker's inputs are separate topics, fetched at their own pace, so
// related records published together may be read in either order:
//   - a login published with its registration may be read first, when the
//     uin is not tracked yet, and would be dropped as a stock account's;
//   - a checkpoint due at once (a backfilled registration, older than every
//     checkpoint) may be judged before the usage published long before it
//     has been read, and an active user judged spam.
//
// So before the tracker drops usage of an untracked uin, it reads its
// uin.registrations partition up to the last stable offset the broker
// reports now, unless it has read registrations published after that
// usage; and before it judges a checkpoint, it reads its
// uin.registrations and uin.usage partitions up to their last stable
// offsets, unless it has read records of both published after the
// checkpoint's timer fired. "Published after" is the record timestamp, so
// producers' clocks are assumed to agree within the time two related
// records are published apart.
//
// Records read ahead are applied and come again from the consumer later;
// the offsets kept in each uin's state (Tracking.registrations_next,
// usage_next) make the second application a no-op, in the same
// transaction as the state, so a crash between the two changes nothing.

// readPosition is how far the tracker has read one input partition.
type readPosition struct {
	next   int64 // the next offset to read (-1: not known yet)
	seenMs int64 // every record published before this time (ms) was applied
}

// catchUp is the tracker's read positions on the inputs it reads ahead.
type catchUp struct {
	cl  *kgo.Client
	adm *kadm.Client
	at  map[string]map[int32]*readPosition
}

func (c *catchUp) position(topic string, p int32) *readPosition {
	if c.at == nil {
		c.at = map[string]map[int32]*readPosition{}
	}
	if c.at[topic] == nil {
		c.at[topic] = map[int32]*readPosition{}
	}
	pos := c.at[topic][p]
	if pos == nil {
		pos = &readPosition{next: -1}
		c.at[topic][p] = pos
	}
	return pos
}

// delivered notes a record the consumer delivered.
func (c *catchUp) delivered(r *kgo.Record) {
	pos := c.position(r.Topic, r.Partition)
	pos.next = max(pos.next, r.Offset+1)
	pos.seenMs = max(pos.seenMs, r.Timestamp.UnixMilli())
}

// forget drops what is known of partitions ps (all when nil): their
// state was rebuilt or a batch's changes were dropped, and what was read
// then may not be in the state any more.
func (c *catchUp) forget(ps map[int32]bool) {
	for _, parts := range c.at {
		for p := range parts {
			if ps == nil || ps[p] {
				delete(parts, p)
			}
		}
	}
}

func (c *catchUp) close() {
	if c.cl != nil {
		c.cl.Close()
	}
}

// catchUpBefore reads partition p of topic ahead of the consumer unless
// every record published up to publishedMs was applied already (a record
// of the same millisecond may have been published before or after); read
// says whether it did.
func (t *Tracker) catchUpBefore(ctx context.Context, topic string, p int32, publishedMs int64, out *streams.Output) (read bool, err error) {
	if t.noReadAhead || len(t.cfg.Kafka.Seeds) == 0 || t.catchUp.position(topic, p).seenMs > publishedMs {
		return false, nil
	}
	return true, t.readAhead(ctx, topic, p, out)
}

// readAhead applies the records of partition p of topic from the
// tracker's position to the end the broker reports now.
func (t *Tracker) readAhead(ctx context.Context, topic string, p int32, out *streams.Output) error {
	c := &t.catchUp
	if c.cl == nil {
		cl, err := t.cfg.Kafka.NewClient()
		if err != nil {
			return err
		}
		c.cl, c.adm = cl, kadm.NewClient(cl)
	}
	pos := c.position(topic, p)
	started := time.Now().UnixMilli()
	from := pos.next
	if from < 0 { // nothing read since the partition came: from the group's commit
		from = 0
		offs, err := c.adm.FetchOffsetsForTopics(ctx, t.cfg.Namespace+Spec.Group, topic)
		if err != nil {
			return fmt.Errorf("tracker: catch up on %s: %w", topic, err)
		}
		if o, ok := offs.Lookup(topic, p); ok && o.At >= 0 {
			from = o.At
		}
	}
	// The last stable offset: what producers committed before now (a
	// transaction still open is not published yet, and reading past it
	// would wait for its end).
	ends, err := c.adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("tracker: catch up on %s: %w", topic, err)
	}
	end, ok := ends.Lookup(topic, p)
	if !ok || end.Err != nil {
		return fmt.Errorf("tracker: catch up on %s/%d: no end offset", topic, p)
	}
	read := 0
	err = streams.ReadRanges(ctx, t.cfg.Kafka, map[string]map[int32]int64{topic: {p: from}},
		map[string]map[int32]int64{topic: {p: end.Offset}}, func(r *kgo.Record) error {
			read++
			return t.applyAhead(r, out)
		})
	if err != nil {
		return fmt.Errorf("tracker: catch up on %s/%d: %w", topic, p, err)
	}
	pos.next = max(pos.next, end.Offset)
	pos.seenMs = max(pos.seenMs, started)
	t.mCatchUps.With(topic).Inc()
	t.mReadAhead.With(topic).Add(float64(read))
	return nil
}

// applyAhead applies a record read ahead of the consumer. A record the
// consumer would refuse is left to it: it refuses it when it comes.
func (t *Tracker) applyAhead(r *kgo.Record, out *streams.Output) error {
	var err error
	switch r.Topic {
	case t.cfg.Topic(schemas.TopicRegistrations):
		var reg pb.UinRegistration
		if streams.Decode(r, &reg) != nil {
			return nil
		}
		err = t.register(&reg, r.Offset, out)
	case t.cfg.Topic(schemas.TopicUsage):
		var u pb.UsageEvent
		if streams.Decode(r, &u) != nil {
			return nil
		}
		_, err = t.usage(&u, r.Offset, out)
	}
	var rejected *streams.RejectError
	if errors.As(err, &rejected) {
		return nil
	}
	return err
}
