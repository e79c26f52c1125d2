package recycle

// The steps of a ticket: grant, ban, backup, delete, cool-down, release;
// each checked against the ticket's state and applied once.

import (
	"fmt"
	"time"

	"surge/processors/timer"
	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

func (s *step) request(req *pb.RecycleStep) error {
	if err := validUin(req.Uin); err != nil {
		return err
	}
	c := s.c
	uin := uint32(req.Uin)
	cur, err := c.staged.state(uin)
	if err != nil {
		return err
	}
	if req.Step == pb.RecycleStepKind_TICKET_GRANTED {
		return s.grant(cur, req)
	}
	if cur == nil || cur.TicketId != req.TicketId {
		return streams.Reject(fmt.Sprintf("unknown ticket %q for uin %d", req.TicketId, uin), nil)
	}
	if req.ExpectedPrev != cur.Step {
		// Lost the compare-and-set: the step already ran (a duplicate
		// request, a competing scheduler) or is out of order.
		c.mRefused.With("cas_conflict").Inc()
		c.cfg.Log.Debug("recycle: compare-and-set lost", "uin", uin, "want", req.Step, "expected_prev", req.ExpectedPrev, "current", cur.Step)
		return nil
	}
	if req.Step == pb.RecycleStepKind_STOPPED {
		if !stoppable[cur.Step] {
			return streams.Reject(fmt.Sprintf("uin %d: cannot stop at %s", uin, cur.Step), nil)
		}
		return s.stop(cur, req.Reason)
	}
	if next[cur.Step] != req.Step {
		return streams.Reject(fmt.Sprintf("uin %d: %s cannot follow %s", uin, req.Step, cur.Step), nil)
	}
	if s.now.UnixMilli() > cur.TicketExpiresAtMs {
		return s.stop(cur, fmt.Sprintf("ticket expired at %d", cur.TicketExpiresAtMs))
	}
	switch req.Step {
	case pb.RecycleStepKind_BAN:
		return s.ban(cur)
	case pb.RecycleStepKind_BACKUP:
		return s.backup(cur)
	case pb.RecycleStepKind_DELETE:
		return s.delete(cur)
	case pb.RecycleStepKind_COOL_DOWN:
		return s.coolDown(cur)
	case pb.RecycleStepKind_RELEASE:
		return s.release(cur)
	}
	return streams.Reject("unhandled step "+req.Step.String(), nil)
}

// grant opens a ticket, after the last check of the login evidence: a
// login newer than the one the check saw means the check is stale.
func (s *step) grant(cur, req *pb.RecycleStep) error {
	c := s.c
	if _, ok := c.cfg.Policy.Ban[req.Category]; !ok {
		return streams.Reject(fmt.Sprintf("unknown category %q for uin %d", req.Category, req.Uin), nil)
	}
	if req.TicketId == "" {
		return streams.Reject(fmt.Sprintf("ticket grant for uin %d without a ticket id", req.Uin), nil)
	}
	if !ended(cur) {
		c.mRefused.With("ticket_open").Inc()
		return nil // another check granted it first; one ticket per uin
	}
	if deleted := deletedAt(cur); deleted != 0 && req.RegisteredAtMs <= deleted {
		// The account this check judged was deleted and its uin recycled:
		// a re-run of a classification over the same facts (ClickHouse
		// keeps the old registration rows). Quiet, like a lost
		// compare-and-set: the uin may be pooled, leased or handed out.
		c.mRefused.With("already_recycled").Inc()
		return nil
	}
	l, err := c.staged.login(uint32(req.Uin))
	if err != nil {
		return err
	}
	if l.Newest() > req.LastLoginMs {
		c.mRefused.With("logged_in_since_check").Inc()
		return s.apply(&pb.RecycleStep{Uin: req.Uin, TicketId: req.TicketId, Step: pb.RecycleStepKind_STOPPED,
			Category: req.Category, Username: req.Username, RegisteredAtMs: req.RegisteredAtMs, DeletedAtMs: deletedAt(cur),
			Reason: fmt.Sprintf("refused: logged in at %d (auth %d, device %d), after the check saw %d", l.Newest(), l.Auth, l.Device, req.LastLoginMs)})
	}
	g := &pb.RecycleStep{Uin: req.Uin, TicketId: req.TicketId, Step: pb.RecycleStepKind_TICKET_GRANTED,
		Category: req.Category, Username: req.Username, Reason: req.Reason, LastLoginMs: req.LastLoginMs,
		RegisteredAtMs: req.RegisteredAtMs, DeletedAtMs: deletedAt(cur), // the uin's last deletion stays the bound
		TicketExpiresAtMs: s.now.Add(c.cfg.Policy.TicketTTL).UnixMilli()}
	if err := s.apply(g); err != nil {
		return err
	}
	return s.requestNext(g, pb.RecycleStepKind_BAN)
}

func (s *step) ban(cur *pb.RecycleStep) error {
	until := s.now.Add(s.c.cfg.Policy.Ban[cur.Category])
	b := s.advance(cur, pb.RecycleStepKind_BAN, until)
	if err := s.apply(b); err != nil {
		return err
	}
	// The account is banned (logins refused) until the ban expires; written
	// before the batch commits (applyEffects).
	s.c.effects.bans = append(s.c.effects.bans, account.Ban{Uin: uint32(cur.Uin), Until: until, TicketID: cur.TicketId,
		Reason: "recycle: " + cur.Category})
	return s.schedule(b, "backup", until, pb.RecycleStepKind_BACKUP)
}

// backup checks, as the seed asks before any backup, that the account is
// still banned and has not logged in since the ban; then it writes the
// core data, keyed by username, to uin.backups.
func (s *step) backup(cur *pb.RecycleStep) error {
	c := s.c
	uin := uint32(cur.Uin)
	l, err := c.staged.login(uin)
	if err != nil {
		return err
	}
	if l.Newest() > cur.AtMs {
		return s.stop(cur, fmt.Sprintf("logged in at %d during the ban", l.Newest()))
	}
	b := s.advance(cur, pb.RecycleStepKind_BACKUP, time.Time{})
	bk, err := c.backupOf(s.ctx, uin)
	switch {
	case err != nil:
		return err
	case bk == nil:
		b.Reason = "no account data to back up"
	default:
		bk.BackedUpAtMs, bk.TicketId, bk.Category = s.now.UnixMilli(), cur.TicketId, cur.Category
		if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicBackups), []byte(bk.Username), bk); err != nil {
			return err
		}
		b.Username = bk.Username
	}
	if err := s.apply(b); err != nil {
		return err
	}
	return s.requestNext(b, pb.RecycleStepKind_DELETE)
}

func (s *step) delete(cur *pb.RecycleStep) error {
	c := s.c
	uin := uint32(cur.Uin)
	if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicDeletions), schemas.UinKey(uin), &pb.DeletionNotice{Uin: cur.Uin,
		Username: cur.Username, TicketId: cur.TicketId, Category: cur.Category, AtMs: s.now.UnixMilli()}); err != nil {
		return err
	}
	// The pool's journal: the uin is no longer used (its rebuild must not
	// count it as handed out once it is pooled again).
	free := &pb.PoolChange{Uin: cur.Uin, Op: pb.PoolChange_FREE, Bucket: c.cfg.Pool.Bucket(uin), AtMs: s.now.UnixMilli()}
	if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicPool), pool.BucketKey(free.Bucket), free); err != nil {
		return err
	}
	d := s.advance(cur, pb.RecycleStepKind_DELETE, time.Time{})
	d.DeletedAtMs = s.now.UnixMilli()
	if err := s.apply(d); err != nil {
		return err
	}
	// Written before the batch commits (applyEffects).
	c.effects.deletes = append(c.effects.deletes, account.Deletion{Uin: uin, Username: cur.Username})
	return s.requestNext(d, pb.RecycleStepKind_COOL_DOWN)
}

func (s *step) coolDown(cur *pb.RecycleStep) error {
	until := s.now.Add(s.c.cfg.Policy.CoolDown[cur.Category])
	cd := s.advance(cur, pb.RecycleStepKind_COOL_DOWN, until)
	if err := s.apply(cd); err != nil {
		return err
	}
	return s.schedule(cd, "release", until, pb.RecycleStepKind_RELEASE)
}

// release puts the uin into the central pool, unless a restore has taken
// it back (it is in use), in which case it stays out.
func (s *step) release(cur *pb.RecycleStep) error {
	c := s.c
	uin := uint32(cur.Uin)
	used, err := c.inUse(s.ctx, uin)
	if err != nil {
		return err
	}
	change := &pb.PoolChange{Uin: cur.Uin, Op: pb.PoolChange_INSERT, Bucket: c.cfg.Pool.Bucket(uin), AtMs: s.now.UnixMilli()}
	r := s.advance(cur, pb.RecycleStepKind_RELEASE, time.Time{})
	if used {
		change.Op, change.Reason = pb.PoolChange_REFUSED, fmt.Sprintf("uin in use: %d", uin)
		r.Reason = "not pooled: " + change.Reason
	} else {
		c.effects.releases = append(c.effects.releases, uin)
	}
	if err := s.out.EmitMsg(c.cfg.Topic(schemas.TopicPool), pool.BucketKey(change.Bucket), change); err != nil {
		return err
	}
	return s.apply(r)
}

// stop ends a ticket before anything irreversible, cancelling its timers.
func (s *step) stop(cur *pb.RecycleStep, reason string) error {
	if cur.Step == pb.RecycleStepKind_BAN { // recycling stops: so does its ban
		s.c.effects.unbans = append(s.c.effects.unbans, account.Ban{Uin: uint32(cur.Uin), TicketID: cur.TicketId})
	}
	for _, what := range []string{"backup", "release"} {
		cancel := timer.Cancel(timerID(cur.TicketId, what))
		cancel.Topic = s.c.cfg.Topic(schemas.TopicTimers)
		s.out.Emit(cancel)
	}
	st := s.advance(cur, pb.RecycleStepKind_STOPPED, time.Time{})
	st.Reason = reason
	return s.apply(st)
}

// advance is the record of the step after cur: same ticket, renewed.
func (s *step) advance(cur *pb.RecycleStep, to pb.RecycleStepKind, due time.Time) *pb.RecycleStep {
	renewed := s.now.Add(s.c.cfg.Policy.TicketTTL)
	if !due.IsZero() {
		renewed = due.Add(s.c.cfg.Policy.TicketTTL) // valid through the wait
	}
	n := &pb.RecycleStep{Uin: cur.Uin, TicketId: cur.TicketId, Step: to, ExpectedPrev: cur.Step,
		Category: cur.Category, Username: cur.Username, LastLoginMs: cur.LastLoginMs,
		RegisteredAtMs: cur.RegisteredAtMs, DeletedAtMs: cur.DeletedAtMs, TicketExpiresAtMs: renewed.UnixMilli()}
	if !due.IsZero() {
		n.DueAtMs = due.UnixMilli()
	}
	return n
}

// apply records an applied step: its changelog entry and the staged state.
func (s *step) apply(st *pb.RecycleStep) error {
	st.AtMs = s.now.UnixMilli()
	s.applied = append(s.applied, st)
	s.c.staged.setState(st)
	if s.c.appliedSteps == nil {
		s.c.appliedSteps = map[pb.RecycleStepKind]int{}
	}
	s.c.appliedSteps[st.Step]++
	return nil
}

// requestNext asks for the step after done, now.
func (s *step) requestNext(done *pb.RecycleStep, to pb.RecycleStepKind) error {
	s.requests = append(s.requests, recycling.Request(done, to))
	return nil
}

// schedule asks for the step after done at a time, through the timer
// service: with the other tickets due then, in one timer.
func (s *step) schedule(done *pb.RecycleStep, what string, at time.Time, to pb.RecycleStepKind) error {
	req := recycling.Request(done, to)
	for i := range s.timed {
		if t := &s.timed[i]; t.what == what && t.at.Equal(at) {
			t.reqs = append(t.reqs, req)
			return nil
		}
	}
	s.timed = append(s.timed, timedRequests{what: what, at: at, reqs: []*pb.RecycleStep{req}})
	return nil
}

func timerID(ticket, what string) string { return "recycle/" + ticket + "/" + what }
