package planner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/internal/job"
	"surge/processors/timer"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// command applies an operator's pause, resume or cancel (push.job-commands).
// A command that does not apply (unknown job, a state it cannot leave that
// way) is dead-lettered with the reason.
func (p *Planner) command(ctx context.Context, e emitter, in *kgo.Record) error {
	var c pb.JobCommand
	if err := streams.Decode(in, &c); err != nil {
		return err
	}
	id := c.JobId
	if id == "" {
		return streams.Reject("job command without a job id", nil)
	}
	if !p.machine.Known(id) {
		return streams.Reject(fmt.Sprintf("%s of unknown job %q", c.Op, id), nil)
	}
	st, q := p.machine.State(id), p.queue[id]
	reason := c.Reason
	if reason == "" {
		reason = strings.ToLower(c.Op.String())
	}
	if c.RequestedBy != "" {
		reason += " (by " + c.RequestedBy + ")"
	}
	refuse := func() error {
		return streams.Reject(fmt.Sprintf("cannot %s job %s: it is %s", strings.ToLower(c.Op.String()), id, st), nil)
	}
	switch c.Op {
	case pb.JobCommand_PAUSE:
		if q == nil || !job.Allowed(st, pb.JobState_PAUSED) {
			return refuse()
		}
		q.state = pb.JobState_PAUSED
		return e.move(id, pb.JobState_PAUSED, reason, func(t *pb.JobTransition) { t.Position = uint64(q.next) })
	case pb.JobCommand_RESUME:
		if q == nil || st != pb.JobState_PAUSED {
			return refuse()
		}
		if err := e.move(id, pb.JobState_RESUMING, reason, nil); err != nil {
			return err
		}
		// Back to SENDING at its position: dispatch goes on from there (or
		// completes it, when its units were all out and are done).
		q.state = pb.JobState_SENDING
		if err := e.move(id, pb.JobState_SENDING, "", func(t *pb.JobTransition) {
			t.Position, t.Targets = uint64(q.next), q.total
		}); err != nil {
			return err
		}
		return p.dispatch(ctx, e)
	case pb.JobCommand_CANCEL:
		if !job.Allowed(st, pb.JobState_CANCELLED) {
			return refuse()
		}
		var dispatched uint32
		var unsent []uint32 // taken back from a silent executor, not sent again
		if q != nil {
			dispatched, unsent = q.next, slices.Sorted(slices.Values(q.redo))
			p.giveBack(q.job, q.targets, dispatched, q.queuedAt, e.now)
			p.giveBackUnits(q.job, q.targets, unsent, q.queuedAt, e.now)
			delete(p.queue, id)
		}
		if id := timerOf(st, id); id != "" { // its timer need not fire
			rec := timer.Cancel(id)
			rec.Topic = p.cfg.Topic(schemas.TopicTimers)
			e.out.Emit(rec)
		}
		return e.move(id, pb.JobState_CANCELLED, reason, func(t *pb.JobTransition) { t.Position, t.RefusedUnits = uint64(dispatched), unsent })
	}
	return streams.Reject(fmt.Sprintf("job command %v for %s: want PAUSE, RESUME or CANCEL", c.Op, id), nil)
}

// scheduleTimer is the id of a scheduled job's timer, quotaTimer of the
// one that wakes a job waiting for quota.
func scheduleTimer(jobID string) string { return "push-job/" + jobID }
func quotaTimer(jobID string) string    { return "push-quota/" + jobID }

// timerOf is the timer a job in state st waits for ("" when none).
func timerOf(st pb.JobState, jobID string) string {
	switch st {
	case pb.JobState_WAITING_SCHEDULE:
		return scheduleTimer(jobID)
	case pb.JobState_WAITING_QUOTA:
		return quotaTimer(jobID)
	}
	return ""
}

// unitSpan cuts unit k out of the filtered package: the targets of rank
// [k*UnitSize, (k+1)*UnitSize), and the uin range [start, end) they span.
func (p *Planner) unitSpan(targets *roaring.Bitmap, k uint32) (part *roaring.Bitmap, start, end uint64, err error) {
	lo := uint64(k) * p.cfg.UnitSize
	first, err := targets.Select(uint32(lo))
	if err != nil {
		return nil, 0, 0, err
	}
	start, end = uint64(first), uint64(targets.Maximum())+1
	if hi := lo + p.cfg.UnitSize; hi < targets.GetCardinality() {
		e, err := targets.Select(uint32(hi))
		if err != nil {
			return nil, 0, 0, err
		}
		end = uint64(e)
	}
	part = roaring.New()
	part.AddRange(start, end)
	part.And(targets)
	return part, start, end, nil
}

// giveBackUnits returns their quota unit and CRC mark to the targets of
// the refused units (never sent).
func (p *Planner) giveBackUnits(j *pb.SendJob, targets *roaring.Bitmap, units []uint32, queuedAtMs int64, now time.Time) {
	for _, k := range units {
		rest, _, _, err := p.unitSpan(targets, k)
		if err != nil {
			continue // no such unit in the package: nothing was taken for it
		}
		p.sent.Forget(j.ContentCrc, rest)
		if !j.Realtime && sameDay(queuedAtMs, now) {
			p.ledger.Refund(rest)
		}
	}
}

// giveBack returns what a cancelled job took from the targets it never
// reached (its units from the dispatched-th on): a unit of today's quota,
// and the CRC filter's mark, so the same content can still reach them.
// Restore does the same on a CANCELLED transition, so the memory rebuilt
// matches.
func (p *Planner) giveBack(j *pb.SendJob, targets *roaring.Bitmap, dispatched uint32, queuedAtMs int64, now time.Time) {
	lo := uint64(dispatched) * p.cfg.UnitSize
	if targets == nil || lo >= targets.GetCardinality() {
		return
	}
	start, err := targets.Select(uint32(lo))
	if err != nil {
		return
	}
	rest := roaring.New()
	rest.AddRange(uint64(start), uint64(targets.Maximum())+1)
	rest.And(targets)
	p.sent.Forget(j.ContentCrc, rest)
	if !j.Realtime && sameDay(queuedAtMs, now) {
		p.ledger.Refund(rest)
	}
}
