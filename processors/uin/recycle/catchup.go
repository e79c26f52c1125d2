package recycle

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Requests and usage are two topics: a login published long before a
// ticket's grant may still be unread by this controller when the grant or
// its ban is applied (the consumer fetches the topics at their own pace),
// and an active user would then be banned until the login arrives. So
// before a grant or a ban is applied, the controller reads its partition
// of uin.usage up to the end the broker reports now, noting the logins,
// as the push planner catches up on follows before it plans a job. A
// login published after that is a real race with the ticket, which the
// design settles: it stops the ticket at the next step.

// usageCatchUp is what the controller knows of its uin.usage partitions.
type usageCatchUp struct {
	adm  *kadm.Client
	cl   *kgo.Client
	next map[int32]int64 // the next usage offset noted, per partition
	done map[int32]bool  // caught up in the batch in flight
}

// needsLogins reports whether a request applies a step that must see
// every login published before it: a grant or a ban.
func needsLogins(req *pb.RecycleStep) bool {
	for _, e := range recycling.Entries(req) {
		if e.Step == pb.RecycleStepKind_TICKET_GRANTED || e.Step == pb.RecycleStepKind_BAN {
			return true
		}
	}
	return false
}

// noteUsageOffset records that usage record at offset was noted.
func (c *Controller) noteUsageOffset(partition int32, offset int64) {
	if c.catchUp.next == nil {
		c.catchUp.next = map[int32]int64{}
	}
	if offset+1 > c.catchUp.next[partition] {
		c.catchUp.next[partition] = offset + 1
	}
}

// catchUpUsage notes the logins of uin.usage partition p published
// before now that the consumer has not delivered yet, once per batch.
func (c *Controller) catchUpUsage(ctx context.Context, p int32) error {
	if c.catchUp.done[p] || len(c.cfg.Kafka.Seeds) == 0 {
		return nil
	}
	topic := c.cfg.Topic(schemas.TopicUsage)
	if c.catchUp.cl == nil {
		cl, err := c.cfg.Kafka.NewClient()
		if err != nil {
			return err
		}
		c.catchUp.cl, c.catchUp.adm = cl, kadm.NewClient(cl)
	}
	from, known := c.catchUp.next[p]
	if !known { // nothing noted since the start: from the group's commit
		offs, err := c.catchUp.adm.FetchOffsetsForTopics(ctx, c.group(), topic)
		if err != nil {
			return fmt.Errorf("recycle: catch up on %s: %w", topic, err)
		}
		if o, ok := offs.Lookup(topic, p); ok && o.At >= 0 {
			from = o.At
		}
	}
	ends, err := c.catchUp.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("recycle: catch up on %s: %w", topic, err)
	}
	end, ok := ends.Lookup(topic, p)
	if !ok || end.Err != nil {
		return fmt.Errorf("recycle: catch up on %s/%d: no end offset", topic, p)
	}
	if end.Offset > from {
		err := streams.ReadRanges(ctx, c.cfg.Kafka, map[string]map[int32]int64{topic: {p: from}},
			map[string]map[int32]int64{topic: {p: end.Offset}}, func(r *kgo.Record) error {
				var u pb.UsageEvent
				if streams.Decode(r, &u) == nil && validUin(u.Uin) == nil && u.Kind == recycling.KindLogin {
					c.staged.noteLogin(&u)
				}
				c.noteUsageOffset(p, r.Offset)
				return nil
			})
		if err != nil {
			return fmt.Errorf("recycle: catch up on %s/%d: %w", topic, p, err)
		}
	}
	c.noteUsageOffset(p, end.Offset-1)
	if c.catchUp.done == nil {
		c.catchUp.done = map[int32]bool{}
	}
	c.catchUp.done[p] = true
	return nil
}

func (c *Controller) closeCatchUp() {
	if c.catchUp.cl != nil {
		c.catchUp.cl.Close()
	}
}
