package executor

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Revocations. When an executor stops reporting (killed, its machine
// gone), the planner takes its units back and sends them through other
// executors. It does so in one transaction under this executor's own
// transactional id, which fences it: a revocation marker per unit on this
// executor's queue, and the list on push.executors (which tells the
// planner; every completion this executor committed is ahead of it).
//
// The fence is what makes "never sent twice" hold:
//   - a transaction of this executor still open is aborted; one that
//     committed did so before the revocation, and its completion counts;
//   - an executor that was only slow finds its session fenced, and one
//     that comes back starts a new session; either way, a session
//     initialises its producer id and only then reads its queue's
//     revocations (OnSessionStart). A revocation committed later would
//     have to fence this session first, ending it. So every revoked unit
//     a session meets, it knows to be revoked, and skips.

// revocation names one dispatch of a unit.
type revocation struct {
	job  string
	unit uint32
	seq  uint64
}

func (x *Executor) revoked(u *pb.SendTaskUnit) bool {
	x.revMu.Lock()
	defer x.revMu.Unlock()
	return x.revocations[revocation{u.JobId, u.UnitId, u.DispatchSeq}]
}

// readRevocations reads the revocations on the queue past the group's
// committed offset: the only units this session may meet.
func (x *Executor) readRevocations(ctx context.Context) error {
	cl, err := x.cfg.Kafka.NewClient()
	if err != nil {
		return err
	}
	offsets, err := kadm.NewClient(cl).FetchOffsets(ctx, group(x.cfg.Namespace, x.cfg.Name))
	cl.Close()
	if err == nil {
		err = offsets.Error()
	}
	if err != nil && !errors.Is(err, kadm.ErrEmpty) {
		return fmt.Errorf("executor: committed offset of %s: %w", x.UnitsTopic(), err)
	}
	from := streams.ReplayFrom{Transactional: true} // the planner writes the queue in transactions
	if o, ok := offsets.Lookup(x.UnitsTopic(), 0); ok && o.At > 0 {
		from.Next = map[int32]int64{0: o.At}
	}
	found := map[revocation]bool{}
	read := func(r *kgo.Record) error {
		var u pb.SendTaskUnit
		if streams.Decode(r, &u) == nil && u.Revoked {
			found[revocation{u.JobId, u.UnitId, u.DispatchSeq}] = true
		}
		return nil
	}
	err = streams.Replay(ctx, x.cfg.Kafka, x.UnitsTopic(), from, read)
	if errors.Is(err, streams.ErrOutOfRetention) { // the commit is older than the queue keeps
		clear(found)
		err = streams.Replay(ctx, x.cfg.Kafka, x.UnitsTopic(), streams.ReplayFrom{Transactional: true}, read)
	}
	if err != nil {
		return fmt.Errorf("executor: read revocations on %s: %w", x.UnitsTopic(), err)
	}
	x.revMu.Lock()
	x.revocations = found
	x.revMu.Unlock()
	if len(found) > 0 {
		x.cfg.Log.Info("executor: units taken back while it was silent will be skipped", "executor", x.cfg.Name, "units", len(found))
	}
	return nil
}
