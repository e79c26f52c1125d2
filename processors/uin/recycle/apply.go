package recycle

// Applying input: a request record (one ticket's step or a batch), a usage
// record, and the batch's outputs.

import (
	"fmt"

	"surge/processors/timer"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// record applies a request record: one ticket's step, or a batch's.
func (s *step) record(partition int32, req *pb.RecycleStep) error {
	c := s.c
	if err := c.checkPartition(partition, req); err != nil {
		return err
	}
	if needsLogins(req) {
		if err := c.catchUpUsage(s.ctx, partition); err != nil {
			return err // the broker: retried
		}
	}
	if len(req.Batch) == 0 {
		if err := s.request(req); err != nil {
			return err
		}
		return s.flush()
	}
	// A refused ticket does not hold back the others: the record goes to
	// the dead letters with the reasons, and what the others did is kept
	// (replayed, they lose the compare-and-set).
	var refused []string
	for _, e := range req.Batch {
		err := s.request(e)
		if streams.IsReject(err) {
			refused = append(refused, err.Error())
			c.mRefused.With("rejected").Inc()
			continue
		}
		if err != nil {
			return err
		}
	}
	if err := s.flush(); err != nil {
		return err
	}
	if len(refused) > 0 {
		return streams.RejectKeeping(fmt.Sprintf("%d of the batch's %d tickets refused; the first: %s", len(refused), len(req.Batch), refused[0]), nil)
	}
	return nil
}

// checkPartition refuses a request whose uins are not in the record's
// partition: this instance holds the logins of that partition's uins
// alone, and would judge another's without them.
func (c *Controller) checkPartition(partition int32, req *pb.RecycleStep) error {
	if len(req.Batch) > 0 && (req.Uin != 0 || req.TicketId != "" || req.Step != pb.RecycleStepKind_RECYCLE_STEP_UNSPECIFIED) {
		return streams.Reject("a batch with a ticket of its own", nil)
	}
	for _, e := range recycling.Entries(req) {
		if len(e.Batch) > 0 {
			return streams.Reject("a batch inside a batch", nil)
		}
		if err := validUin(e.Uin); err != nil {
			return err
		}
		if p := streams.PartitionFor(schemas.UinKey(uint32(e.Uin)), c.partitions); int32(p) != partition {
			return streams.Reject(fmt.Sprintf("uin %d belongs to partition %d, the record is on %d (key a record by its first uin)", e.Uin, p, partition), nil)
		}
	}
	return nil
}

// flush emits what the record's tickets gathered: their applied steps,
// the steps requested now, and a timer per due time, each as one record
// (a single ticket's as before batches, keyed by its uin; a batch keyed by
// its first uin, which puts it in the same partition).
func (s *step) flush() error {
	c := s.c
	if len(s.applied) > 0 {
		if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicRecycleSteps), recycling.Key(s.applied), recycling.Batch(s.applied)); err != nil {
			return err
		}
	}
	if len(s.requests) > 0 {
		if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicRecycleReqs), recycling.Key(s.requests), recycling.Batch(s.requests)); err != nil {
			return err
		}
	}
	for _, t := range s.timed {
		id := timerID(t.reqs[0].TicketId, t.what)
		if len(t.reqs) > 1 { // not the first ticket's own timer: stopping that ticket must not cancel it
			id = "recycle/batch/" + t.reqs[0].TicketId + "/" + t.what
		}
		rec, err := timer.Schedule(id, t.at, c.cfg.Topic(schemas.TopicRecycleReqs), recycling.Key(t.reqs), recycling.Batch(t.reqs))
		if err != nil {
			return err
		}
		rec.Topic = c.cfg.Topic(schemas.TopicTimers)
		s.out.Emit(rec)
	}
	s.applied, s.requests, s.timed = nil, nil, nil
	return nil
}

// usage keeps the login index and stops or monitors banned accounts.
func (s *step) usage(u *pb.UsageEvent) error {
	if err := validUin(u.Uin); err != nil {
		return err
	}
	c := s.c
	c.staged.noteLogin(u)
	cur, err := c.staged.state(uint32(u.Uin))
	if err != nil || ended(cur) {
		return err
	}
	if u.AtMs <= cur.LastLoginMs {
		return nil // the check already knew of it (usage is consumed late, and replayed)
	}
	switch u.Kind {
	case recycling.KindLogin, recycling.KindUnban:
		if cur.Step == pb.RecycleStepKind_TICKET_GRANTED || cur.Step == pb.RecycleStepKind_BAN {
			return s.stop(cur, fmt.Sprintf("%s at %d (%s) before backup", u.Kind, u.AtMs, u.Source))
		}
		if u.Kind == recycling.KindLogin {
			c.mBannedLogins.With(cur.Category).Inc()
		}
	case recycling.KindLoginRefused:
		c.mBannedLogins.With(cur.Category).Inc()
	}
	return nil
}
