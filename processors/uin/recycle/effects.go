package recycle

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/account"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Redis work is batched per Kafka batch, not done per record: what a
// step must read (the account to back up, whether a uin to release is
// free) is fetched for the whole batch before the handler runs, and what
// a step writes (deleting accounts, freeing and pooling uins) is queued by
// the handler and written in one pipeline before the batch commits. The
// writes are idempotent: an aborted batch runs them again.

// prefetched is what the batch's steps will read.
type prefetched struct {
	decoded map[*kgo.Record]*pb.RecycleStep // the batch's requests, decoded once
	err     error
	backups map[uint32]*pb.AccountBackup // absent: no account data
	asked   map[uint32]bool              // uins whose backups were fetched
	used    map[uint32]bool              // uins to release that are in use (a restore took them)
	polled  map[uint32]bool              // uins whose pool status was fetched
}

// effects is what the batch's steps write.
type effects struct {
	bans, unbans []account.Ban
	deletes      []account.Deletion
	releases     []uint32
}

// prefetchBatch reads, in two or three round trips, what the batch's
// BACKUP and RELEASE requests need.
func (c *Controller) prefetchBatch(ctx context.Context, recs []*kgo.Record) {
	var backup, release []uint32
	decoded := map[*kgo.Record]*pb.RecycleStep{}
	for _, r := range recs {
		if r.Topic != c.cfg.Topic(schemas.TopicRecycleReqs) {
			continue
		}
		req := new(pb.RecycleStep)
		if streams.Decode(r, req) != nil {
			continue
		}
		decoded[r] = req
		for _, e := range recycling.Entries(req) {
			if validUin(e.Uin) != nil {
				continue
			}
			switch e.Step {
			case pb.RecycleStepKind_BACKUP:
				backup = append(backup, uint32(e.Uin))
			case pb.RecycleStepKind_RELEASE:
				release = append(release, uint32(e.Uin))
			}
		}
	}
	p := prefetched{decoded: decoded, asked: map[uint32]bool{}, polled: map[uint32]bool{}, used: map[uint32]bool{}}
	if len(backup) > 0 {
		p.backups, p.err = c.cfg.Accounts.BackupMany(ctx, backup)
		for _, u := range backup {
			p.asked[u] = true
		}
	}
	if len(release) > 0 && p.err == nil {
		var used []bool
		used, p.err = c.cfg.Pool.Status(ctx, release)
		for i, u := range release {
			p.polled[u] = true
			if p.err == nil && used[i] {
				p.used[u] = true
			}
		}
	}
	c.mu.Lock()
	c.prefetch = p
	c.mu.Unlock()
}

// backupOf is the prefetched backup of uin (nil: no account data).
func (c *Controller) backupOf(ctx context.Context, uin uint32) (*pb.AccountBackup, error) {
	if c.prefetch.err != nil {
		return nil, c.prefetch.err
	}
	if !c.prefetch.asked[uin] { // a request the prefetch did not see
		m, err := c.cfg.Accounts.BackupMany(ctx, []uint32{uin})
		return m[uin], err
	}
	return c.prefetch.backups[uin], nil
}

// inUse says whether a uin to release is in use (prefetched).
func (c *Controller) inUse(ctx context.Context, uin uint32) (bool, error) {
	if c.prefetch.err != nil {
		return false, c.prefetch.err
	}
	if !c.prefetch.polled[uin] {
		return c.cfg.Pool.InUse(ctx, uin)
	}
	return c.prefetch.used[uin], nil
}

// applyEffects writes the batch's bans, deletions and releases before it
// commits.
func (c *Controller) applyEffects(ctx context.Context) error {
	c.mu.Lock()
	e := c.effects
	c.mu.Unlock()
	if len(e.bans) > 0 {
		if err := c.cfg.Accounts.BanMany(ctx, e.bans); err != nil {
			return fmt.Errorf("recycle: ban accounts: %w", err)
		}
	}
	if len(e.unbans) > 0 {
		if err := c.cfg.Accounts.UnbanMany(ctx, e.unbans); err != nil {
			return fmt.Errorf("recycle: lift bans: %w", err)
		}
	}
	if len(e.deletes) > 0 {
		if err := c.cfg.Accounts.DeleteMany(ctx, e.deletes); err != nil {
			return fmt.Errorf("recycle: delete accounts: %w", err)
		}
		uins := make([]uint32, len(e.deletes))
		for i, d := range e.deletes {
			uins[i] = d.Uin
		}
		kept, err := c.cfg.Pool.Free(ctx, uins...)
		if err != nil {
			return fmt.Errorf("recycle: free uins: %w", err)
		}
		for _, u := range kept { // the grant's check lets none through; a second guard
			c.mRefused.With("free_pooled").Inc()
			c.cfg.Log.Warn("recycle: deleted account's uin is pooled or leased; its pool bits kept", "uin", u)
		}
	}
	if len(e.releases) > 0 {
		refused, err := c.cfg.Pool.InsertIfFree(ctx, e.releases)
		if err != nil {
			return fmt.Errorf("recycle: pool uins: %w", err)
		}
		// Taken between the prefetch and now (a restore): kept out of the
		// pool, which is the safe side; the RELEASE record says pooled.
		for _, u := range refused {
			c.mRefused.With("release_raced").Inc()
			c.cfg.Log.Warn("recycle: uin taken while being released; not pooled", "uin", u)
		}
	}
	return nil
}
