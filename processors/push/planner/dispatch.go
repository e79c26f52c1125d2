package planner

// Dispatch: queued jobs cut into units and assigned to executors by their
// reported load, drained, finished or expired.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	pb "surge/schemas/surgev1"
)

func (p *Planner) observeLoad(l *pb.ExecutorLoad, now time.Time) {
	ev := p.executor(l.Executor)
	if len(l.Revoked) > 0 {
		p.takeBack(l.Executor, l.Revoked)
		return // a revocation, written by a planner: not a sign of life
	}
	if l.DoneJobId != "" {
		delete(ev.inflight, unitKey(l.DoneJobId, l.DoneUnitId))
		if q := p.queue[l.DoneJobId]; q != nil {
			q.markDone(l)
		}
		return // a completion, not a heartbeat
	}
	ev.load, ev.seen = l, now
}

// unitRef names one unit of one job.
type unitRef struct {
	job  string
	unit uint32
}

func unitKey(jobID string, unit uint32) unitRef { return unitRef{jobID, unit} }

func (u unitRef) String() string { return fmt.Sprintf("%s/%d", u.job, u.unit) }

// executor is the view of executor name, made on first mention.
func (p *Planner) executor(name string) *executorView {
	ev := p.executors[name]
	if ev == nil {
		ev = &executorView{inflight: map[unitRef]bool{}}
		p.executors[name] = ev
	}
	return ev
}

// free is how many more units an executor takes now: within the
// planner's backlog per executor and the capacity the executor reports
// (uins it takes at once; a smaller machine reports less), at least one
// unit in flight so any executor makes progress.
func (p *Planner) free(ev *executorView, now time.Time) int {
	if ev.load == nil || ev.load.Draining || now.Sub(ev.seen) > p.cfg.ExecutorTimeout || ev.revoked.After(ev.seen) {
		return 0
	}
	limit := p.cfg.MaxBacklog
	if c := ev.load.CapacityUins; c > 0 {
		limit = min(limit, max(int(c/p.cfg.UnitSize), 1))
	}
	return max(limit-len(ev.inflight), 0)
}

// dispatch hands out units by score while executors have room, finishes
// jobs whose units are all done, and marks pre-empted the jobs that were
// sending but lost their room to a higher score.
func (p *Planner) dispatch(_ context.Context, e emitter) error {
	jobs := make([]*queued, 0, len(p.queue))
	for _, q := range p.queue {
		jobs = append(jobs, q)
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].score() > jobs[b].score() })
	names := make([]string, 0, len(p.executors))
	room := map[string]int{}
	for name, ev := range p.executors {
		if f := p.free(ev, e.now); f > 0 {
			names = append(names, name)
			room[name] = f
		}
	}
	slices.Sort(names)
	for _, q := range jobs {
		if q.state == pb.JobState_PAUSED {
			continue // its dispatched units finish; nothing more goes out
		}
		if draining, err := p.drain(e, q); err != nil {
			return err
		} else if draining {
			continue // nothing more goes out until the draining executors finish its units
		}
		if q.next == q.units && len(q.redo) == 0 {
			if len(q.done) == int(q.units) {
				if err := p.finish(e, q); err != nil {
					return err
				}
			}
			continue
		}
		if expired(q.job, e.now) {
			if err := p.expire(e, q); err != nil {
				return err
			}
			continue // nothing more goes out
		}
		assigned, err := p.assign(e, q, names, room)
		if err != nil {
			return err
		}
		if assigned == 0 && q.state == pb.JobState_SENDING && !q.job.Realtime && p.busyWithHigher(q, jobs) {
			if err := e.move(q.job.JobId, pb.JobState_PREEMPTED, "executors busy with higher-score jobs", nil); err != nil {
				return err
			}
			q.state = pb.JobState_PREEMPTED
		}
	}
	return nil
}

// drain moves a sending job with units on a draining executor (one leaving
// for an upgrade, see executor.Drain) to DRAINING: those units finish
// there and nothing more of the job goes out meanwhile, so the hand-over
// to the executors that stay is clean. Once they are done it resumes
// (RESUMING, SENDING) and dispatch goes on from its position, on the
// executors that remain. It reports whether q is (still) draining.
func (p *Planner) drain(e emitter, q *queued) (bool, error) {
	id := q.job.JobId
	switch q.state {
	case pb.JobState_SENDING:
		x := p.drainingHolder(q)
		if x == "" {
			return false, nil
		}
		q.state = pb.JobState_DRAINING
		return true, e.move(id, pb.JobState_DRAINING, "executor "+x+" is draining: its units of the job finish first", func(t *pb.JobTransition) {
			t.Position, t.Targets = uint64(q.next), q.total
		})
	case pb.JobState_DRAINING:
		if p.drainingHolder(q) != "" {
			return true, nil
		}
		if err := e.move(id, pb.JobState_RESUMING, "drained", nil); err != nil {
			return false, err
		}
		q.state = pb.JobState_SENDING
		return false, e.move(id, pb.JobState_SENDING, "", func(t *pb.JobTransition) { t.Position, t.Targets = uint64(q.next), q.total })
	}
	return false, nil
}

// drainingHolder is a draining executor holding a unit of q not yet done
// ("" when none).
func (p *Planner) drainingHolder(q *queued) string {
	for name := range q.executor {
		ev := p.executors[name]
		if ev == nil || ev.load == nil || !ev.load.Draining {
			continue
		}
		for u := range q.next {
			if !q.done[u] && ev.inflight[unitKey(q.job.JobId, u)] {
				return name
			}
		}
	}
	return ""
}

// markDone records a unit's completion (once; a refusal is kept).
func (q *queued) markDone(l *pb.ExecutorLoad) {
	if q.done[l.DoneUnitId] {
		return
	}
	q.done[l.DoneUnitId] = true
	q.redo = slices.DeleteFunc(q.redo, func(u uint32) bool { return u == l.DoneUnitId })
	if l.DoneRefused {
		q.refused = append(q.refused, l.DoneUnitId)
	}
}

// finish ends a job whose units are all done: COMPLETED, or
// PARTIALLY_COMPLETED when an executor refused some, whose targets get
// their quota and CRC mark back (restore does the same from the
// transition's refused_units).
func (p *Planner) finish(e emitter, q *queued) error {
	delete(p.queue, q.job.JobId)
	if len(q.refused) == 0 {
		return e.move(q.job.JobId, pb.JobState_COMPLETED, "", func(t *pb.JobTransition) {
			t.Position, t.Targets = uint64(q.units), q.total
		})
	}
	refused := slices.Clone(q.refused)
	slices.Sort(refused)
	p.giveBackUnits(q.job, q.targets, refused, q.queuedAt, e.now)
	return e.move(q.job.JobId, pb.JobState_PARTIALLY_COMPLETED, fmt.Sprintf("%d of %d units refused by executors", len(refused), q.units),
		func(t *pb.JobTransition) { t.Position, t.Targets, t.RefusedUnits = uint64(q.units), q.total, refused })
}

// expired reports whether a job with a deadline is past it.
func expired(j *pb.SendJob, now time.Time) bool {
	return j.ExpiresAtMs != 0 && now.UnixMilli() >= j.ExpiresAtMs
}

// expire ends a job past its deadline that still had units to dispatch:
// EXPIRED when none went out, PARTIALLY_COMPLETED once those that did are
// done (until then it waits, dispatching nothing). Its targets never
// dispatched get their quota and CRC mark back (giveBack; restore does
// the same on these transitions).
func (p *Planner) expire(e emitter, q *queued) error {
	id := q.job.JobId
	why := "expired at " + time.UnixMilli(q.job.ExpiresAtMs).UTC().Format(time.RFC3339)
	switch {
	case q.next == 0 && (q.state == pb.JobState_QUEUED || q.state == pb.JobState_PREEMPTED):
		p.giveBack(q.job, q.targets, 0, q.queuedAt, e.now)
		delete(p.queue, id)
		return e.move(id, pb.JobState_EXPIRED, why+" before any unit went out", nil)
	case len(q.done)+len(q.redo) < int(q.next):
		return nil // units still out: their outcome is the job's
	}
	if q.state == pb.JobState_PREEMPTED {
		if err := e.move(id, pb.JobState_RESUMING, why, nil); err != nil {
			return err
		}
		if err := e.move(id, pb.JobState_SENDING, why, func(t *pb.JobTransition) { t.Position, t.Targets = uint64(q.next), q.total }); err != nil {
			return err
		}
	}
	// Units refused, and units taken back from a silent executor and not
	// sent again, reached nobody: their targets get their marks back too.
	unsent := slices.Sorted(slices.Values(append(slices.Clone(q.refused), q.redo...)))
	p.giveBack(q.job, q.targets, q.next, q.queuedAt, e.now)
	p.giveBackUnits(q.job, q.targets, unsent, q.queuedAt, e.now)
	delete(p.queue, id)
	return e.move(id, pb.JobState_PARTIALLY_COMPLETED, fmt.Sprintf("%s: %d of %d units sent", why, int(q.next)-len(unsent), q.units), func(t *pb.JobTransition) {
		t.Position, t.Targets, t.RefusedUnits = uint64(q.next), q.total, unsent
	})
}

// busyWithHigher reports whether a higher-score job is holding units.
func (p *Planner) busyWithHigher(q *queued, jobs []*queued) bool {
	for _, o := range jobs {
		if o == q {
			return false
		}
		if o.next > 0 && len(o.done) < int(o.next) {
			return true
		}
	}
	return false
}

// assign gives q as many units as the executors have room for, preferring
// one executor that can take all its remaining units.
func (p *Planner) assign(e emitter, q *queued, names []string, room map[string]int) (int, error) {
	remaining := len(q.redo) + int(q.units-q.next)
	var order []string
	for _, n := range names {
		if room[n] >= remaining {
			order = []string{n} // fits on one: use only it
			break
		}
	}
	if order == nil {
		order = slices.Clone(names)
		sort.SliceStable(order, func(a, b int) bool { return room[order[a]] > room[order[b]] })
	}
	type plan struct {
		executor string
		n        int
	}
	var plans []plan
	for _, n := range order {
		if remaining == 0 {
			break
		}
		if k := min(room[n], remaining); k > 0 {
			plans = append(plans, plan{n, k})
			remaining -= k
		}
	}
	if len(plans) == 0 {
		return 0, nil
	}
	id := q.job.JobId
	switch q.state {
	case pb.JobState_PREEMPTED:
		if err := e.move(id, pb.JobState_RESUMING, "", nil); err != nil {
			return 0, err
		}
	}
	if err := e.move(id, pb.JobState_DISPATCHING, "", nil); err != nil {
		return 0, err
	}
	// Units taken back from a silent executor go first, then new ones.
	var handed []*pb.UnitDispatch
	var used []string
	for _, pl := range plans {
		for range pl.n {
			k := q.next
			if len(q.redo) > 0 {
				k, q.redo = q.redo[0], q.redo[1:]
			} else {
				q.next++
			}
			handed = append(handed, &pb.UnitDispatch{UnitId: k, Executor: pl.executor})
		}
		room[pl.executor] -= pl.n
		q.executor[pl.executor] = true
		used = append(used, pl.executor)
		p.mUnits.With(pl.executor).Add(float64(pl.n))
	}
	q.state = pb.JobState_SENDING
	if err := e.move(id, pb.JobState_SENDING, "", func(t *pb.JobTransition) {
		t.Position, t.Executor, t.Targets, t.Dispatched = uint64(q.next), strings.Join(used, ","), q.total, handed
	}); err != nil {
		return 0, err
	}
	seq := p.seq // the SENDING step's: each unit names the dispatch it is
	for _, d := range handed {
		u, err := p.unit(q, d.UnitId, d.Executor)
		if err != nil {
			return 0, err
		}
		u.DispatchSeq = seq
		ev := p.executors[d.Executor]
		if err := e.out.EmitMsg(ev.load.UnitsTopic, []byte(id), u); err != nil {
			return 0, err
		}
		ev.inflight[unitKey(id, d.UnitId)] = true
		q.holder[d.UnitId] = holding{executor: d.Executor, seq: seq}
	}
	return len(handed), nil
}

// unit is the record of unit k of q for executor (unitSpan cuts it).
func (p *Planner) unit(q *queued, k uint32, executor string) (*pb.SendTaskUnit, error) {
	part, start, end, err := p.unitSpan(q.targets, k)
	if err != nil {
		return nil, err
	}
	buf, err := part.ToBytes()
	if err != nil {
		return nil, err
	}
	j := q.job
	return &pb.SendTaskUnit{JobId: j.JobId, UnitId: k, Executor: executor, PackageUri: j.PackageUri,
		RangeStart: start, RangeEnd: end, Count: part.GetCardinality(), ContentId: j.ContentId,
		DisplayAtMs: j.DisplayAtMs, Targets: buf, ContentCrc: j.ContentCrc, UnitsTotal: q.units,
		Realtime: j.Realtime, AccountId: j.AccountId}, nil
}
