package recycle

import (
	"context"
	"time"

	"surge/processors/uin/account"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Bans live in Redis (the login service reads them), written as effects of
// BAN steps. They are a cache of the controller's state, which is rebuilt
// from uin.recycle-steps: when Redis lost them (a partition's bans marker
// is gone), the controller bans again every uin of its partitions whose
// ticket is at BAN and not yet due for its backup, then sets the marker.
// (Until it does, a banned user's login goes through and stops the
// ticket: the safe side.)

// bansCheckEvery is how often the markers are read.
const bansCheckEvery = 2 * time.Second

// keepBans writes the bans of the partitions this instance holds again
// where their marker is missing; on the processing goroutine, at most
// every bansCheckEvery.
func (c *Controller) keepBans(ctx context.Context) {
	if c.cfg.Accounts == nil || time.Since(c.bansChecked) < bansCheckEvery {
		return
	}
	c.bansChecked = time.Now()
	var current []int32
	for _, p := range c.restore.Owned() {
		if c.restore.Current(p) {
			current = append(current, p)
		}
	}
	if len(current) == 0 {
		return
	}
	missing, err := c.cfg.Accounts.BansMissing(ctx, current)
	if err != nil || len(missing) == 0 {
		return
	}
	n, err := c.rebanPartitions(ctx, missing)
	if err != nil {
		c.cfg.Log.Warn("recycle: bans not written again; trying again", "partitions", missing, "err", err)
		return
	}
	c.cfg.Log.Info("recycle: bans written again from the controller's state", "partitions", missing, "bans", n)
}

// rebanPartitions bans again the uins of partitions ps at BAN, and marks
// the partitions; it answers how many bans it wrote.
func (c *Controller) rebanPartitions(ctx context.Context, ps []int32) (int, error) {
	c.mu.Lock()
	want := map[int32]bool{}
	for _, p := range ps {
		want[p] = true
	}
	now := c.cfg.Now()
	st := newStore(c.committed)
	var bans []account.Ban
	it := c.committed.known.Iterator()
	for it.HasNext() {
		u := it.Next()
		if !want[int32(streams.PartitionFor(schemas.UinKey(u), c.partitions))] {
			continue
		}
		cur, err := st.state(u)
		if err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if cur != nil && cur.Step == pb.RecycleStepKind_BAN && cur.DueAtMs > now.UnixMilli() {
			bans = append(bans, account.Ban{Uin: u, Until: time.UnixMilli(cur.DueAtMs), TicketID: cur.TicketId, Reason: "recycle: " + cur.Category})
		}
	}
	c.mu.Unlock()
	if len(bans) > 0 {
		if err := c.cfg.Accounts.BanMany(ctx, bans); err != nil {
			return 0, err
		}
	}
	for _, p := range ps {
		if err := c.cfg.Accounts.MarkBans(ctx, p); err != nil {
			return 0, err
		}
	}
	return len(bans), nil
}
