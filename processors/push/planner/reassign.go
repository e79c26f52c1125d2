package planner

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/executor"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Reassignment: the units of an executor that stopped reporting (killed,
// its machine gone) are taken back and sent by executors that are alive,
// and never sent twice.
//
//  1. revokeSilent notices an executor silent for ReassignAfter that holds
//     units not done, and revokes them: in one transaction under that
//     executor's own transactional id (which fences it: an open
//     transaction of its is aborted, a committed one came before), a
//     revocation marker per unit on its queue and the list on
//     push.executors. The executor's side is in executor/revoke.go: it
//     never sends a unit revoked from it, whether it was only slow or
//     comes back.
//  2. The planner reads the list on push.executors in order after every
//     completion the executor committed (takeBack): a unit done there
//     counts; the others are sent again (redo), first, with a new
//     dispatch seq that the revocation does not name.
//
// A dispatch is named by the seq of the SENDING transition that made it
// (JobTransition.dispatched, SendTaskUnit.dispatch_seq), so a revocation
// applies to that dispatch only, never to a later one of the same unit: a
// restore that reads an old revocation after the unit went out again
// leaves it alone.

// holding is a unit's latest dispatch: to whom, by which transition.
type holding struct {
	executor string
	seq      uint64
}

// revokeSweep bounds how often revokeSilent looks at the executors.
const revokeSweep = time.Second

// revokeSilent starts the revocation of the units of every executor
// silent for ReassignAfter (at most one at a time per executor, and again
// only after another ReassignAfter).
func (p *Planner) revokeSilent(now time.Time) {
	if p.cfg.ReassignAfter < 0 || p.runCtx == nil || now.Sub(p.lastSweep) < revokeSweep {
		return
	}
	p.lastSweep = now
	for name, ev := range p.executors {
		if len(ev.inflight) == 0 || now.Sub(p.revoking[name]) < p.cfg.ReassignAfter {
			continue
		}
		last := p.activeSince
		if ev.seen.After(last) {
			last = ev.seen
		}
		if now.Sub(last) < p.cfg.ReassignAfter {
			continue
		}
		var units []*pb.RevokedUnit
		for ref := range ev.inflight {
			q := p.queue[ref.job]
			if q == nil || q.done[ref.unit] {
				continue
			}
			if h, ok := q.holder[ref.unit]; ok && h.executor == name {
				units = append(units, &pb.RevokedUnit{JobId: ref.job, UnitId: ref.unit, DispatchSeq: h.seq})
			}
		}
		if len(units) == 0 {
			continue
		}
		slices.SortFunc(units, func(a, b *pb.RevokedUnit) int {
			return cmp.Or(strings.Compare(a.JobId, b.JobId), cmp.Compare(a.UnitId, b.UnitId))
		})
		p.revoking[name] = now
		topic := executor.UnitsTopic(p.cfg.Namespace, name)
		if ev.load != nil && ev.load.UnitsTopic != "" {
			topic = ev.load.UnitsTopic
		}
		p.log.Warn("planner: executor silent; taking its units back", "executor", name,
			"silent_for", now.Sub(last).Round(time.Millisecond), "units", len(units))
		go p.revoke(p.runCtx, name, topic, units)
	}
}

// revoke writes a revocation; on failure the next sweep after
// ReassignAfter tries again (an executor that came back in between is not
// silent any more, and keeps its units).
func (p *Planner) revoke(ctx context.Context, name, topic string, units []*pb.RevokedUnit) {
	if err := RevokeUnits(ctx, p.cfg.Kafka, p.cfg.Namespace, name, topic, units); err != nil {
		if ctx.Err() == nil {
			p.log.Warn("planner: could not take a silent executor's units back; will try again", "executor", name, "err", err)
		}
		return
	}
	p.mRevoked.With(name).Add(float64(len(units)))
	p.log.Info("planner: took a silent executor's units back", "executor", name, "units", len(units))
}

// RevokeUnits takes units back from executor name in namespace ns: one
// transaction under the executor's transactional id (fencing it) with a
// revocation marker per unit on its queue (topic) and the list on
// push.executors, keyed like the executor's completions so it lands after
// them. A planner's takeBack then sends them again.
func RevokeUnits(ctx context.Context, kc streams.Cluster, ns, name, topic string, units []*pb.RevokedUnit) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl, err := kc.NewClient(kgo.TransactionalID(executor.TransactionalID(ns, name)), kgo.TransactionTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("fence executor %s: %w", name, err)
	}
	if err := cl.BeginTransaction(); err != nil {
		return err
	}
	recs := make([]*kgo.Record, 0, len(units)+1)
	for _, u := range units {
		r, err := streams.NewRecord(topic, []byte(u.JobId), &pb.SendTaskUnit{JobId: u.JobId, UnitId: u.UnitId,
			DispatchSeq: u.DispatchSeq, Executor: name, Revoked: true})
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	r, err := streams.NewRecord(ns+schemas.TopicExecutors, []byte(name), &pb.ExecutorLoad{Executor: name,
		UnitsTopic: topic, AtMs: time.Now().UnixMilli(), Revoked: units})
	if err != nil {
		return err
	}
	recs = append(recs, r)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		_ = cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
		return err
	}
	return cl.EndTransaction(ctx, kgo.TryCommit)
}

// takeBack applies a revocation read on push.executors: each unit still
// held by that dispatch and not done is sent again.
func (p *Planner) takeBack(name string, units []*pb.RevokedUnit) {
	ev := p.executor(name)
	ev.revoked = p.cfg.Now() // nothing new for it until it reports again
	n := 0
	for _, u := range units {
		q := p.queue[u.JobId]
		if q == nil || !q.revoke(name, u) {
			continue
		}
		delete(ev.inflight, unitKey(u.JobId, u.UnitId))
		n++
	}
	if n > 0 {
		p.log.Info("planner: units of a silent executor will be sent by others", "executor", name, "units", n)
	}
}

// revoke moves unit u to redo when its latest dispatch is the one revoked
// from name and it is not done.
func (q *queued) revoke(name string, u *pb.RevokedUnit) bool {
	h, ok := q.holder[u.UnitId]
	if !ok || h.executor != name || h.seq != u.DispatchSeq || q.done[u.UnitId] || slices.Contains(q.redo, u.UnitId) {
		return false
	}
	q.redo = append(q.redo, u.UnitId)
	return true
}

// dispatched records a SENDING transition's units in a restore.
func (pr *progress) dispatched(t *pb.JobTransition) {
	if len(t.Dispatched) == 0 {
		return
	}
	if pr.holders == nil {
		pr.holders = map[uint32]holding{}
	}
	for _, d := range t.Dispatched {
		pr.holders[d.UnitId] = holding{executor: d.Executor, seq: t.Seq}
	}
}

// rebuildInflight gives each executor the restored queue's units it holds
// and has not done: what its completions and revocations are matched to.
func (p *Planner) rebuildInflight() {
	for id, q := range p.queue {
		for u, h := range q.holder {
			if !q.done[u] && !slices.Contains(q.redo, u) {
				p.executor(h.executor).inflight[unitKey(id, u)] = true
				q.executor[h.executor] = true
			}
		}
	}
}
