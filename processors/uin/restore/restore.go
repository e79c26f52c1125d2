// Package restore brings a recycled account back from its backup (seed
// 003's restore tool). Backups are on the compacted uin.backups, keyed by
// username. When the old uin is still free (cooling down, or pooled but
// not handed out) the account gets it back; when it was reused, the user
// gets a new uin with the restored data and never notices. Friends are
// mapped back from usernames to their current uins.
//
// A restored account is announced on uin.registrations (channel
// "restore"), so the sinks, the tracker and the stock classification know
// who holds the uin. If its recycle ticket is still cooling down, the
// release step later finds the uin in use and keeps it out of the pool.
package restore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/processors/uin/tracker"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Errors a restore can end with.
var (
	ErrNoBackup = errors.New("restore: no backup")
	ErrLive     = errors.New("restore: account is live")
)

// Tool restores accounts.
type Tool struct {
	Brokers   []string
	Namespace string
	Accounts  *account.Store
	Pool      *pool.Central
	Now       func() time.Time
}

// Result says where an account was restored.
type Result struct {
	Username string
	OldUin   uint32
	Uin      uint32
	Reused   bool // the old uin belongs to somebody else now
	Friends  int  // friends found again
}

// FindBackup reads the newest backup of username from uin.backups.
func FindBackup(ctx context.Context, brokers []string, topic, username string) (*pb.AccountBackup, error) {
	var found *pb.AccountBackup
	err := streams.ReadToEnd(ctx, brokers, topic, func(r *kgo.Record) error {
		if string(r.Key) != username {
			return nil
		}
		if r.Value == nil {
			found = nil
			return nil
		}
		b := new(pb.AccountBackup)
		if err := streams.Decode(r, b); err != nil {
			return fmt.Errorf("restore: backup of %q at %d/%d unreadable: %w", username, r.Partition, r.Offset, err)
		}
		found = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("%w for username %q in %s", ErrNoBackup, username, topic)
	}
	return found, nil
}

// Restore brings username back.
func (t *Tool) Restore(ctx context.Context, username string) (Result, error) {
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	if u, live, err := t.Accounts.UinOf(ctx, username); err != nil {
		return Result{}, err
	} else if live {
		return Result{}, fmt.Errorf("%w: %q is on uin %d; nothing to restore", ErrLive, username, u)
	}
	b, err := FindBackup(ctx, t.Brokers, t.Namespace+schemas.TopicBackups, username)
	if err != nil {
		return Result{}, err
	}
	res := Result{Username: username, OldUin: uint32(b.OldUin)}
	free, err := t.Pool.Claim(ctx, res.OldUin)
	if err != nil {
		return res, err
	}
	res.Uin = res.OldUin
	if !free {
		res.Reused = true
		if res.Uin, err = t.Pool.TakeOne(ctx, rand.New(rand.NewPCG(uint64(now().UnixNano()), b.OldUin))); err != nil {
			return res, fmt.Errorf("restore: old uin %d was reused and no new uin is available: %w", res.OldUin, err)
		}
	}
	a, err := t.Accounts.FromBackup(ctx, b, res.Uin)
	if err != nil {
		return res, err
	}
	res.Friends = len(a.Friends)
	if err := t.Accounts.Create(ctx, a); err != nil {
		return res, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(t.Brokers...))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	rec, err := streams.NewRecord(t.Namespace+schemas.TopicRegistrations, schemas.UinKey(res.Uin), &pb.UinRegistration{
		Uin: uint64(res.Uin), Username: username, Channel: tracker.ChannelRestore, Completed: true, AtMs: now().UnixMilli()})
	if err != nil {
		return res, err
	}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return res, fmt.Errorf("restore: account restored on uin %d but its registration was not published: %w", res.Uin, err)
	}
	return res, nil
}
