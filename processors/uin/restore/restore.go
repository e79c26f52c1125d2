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
	"surge/processors/uin/uinkeys"
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
	Kafka     streams.Cluster
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
func FindBackup(ctx context.Context, kc streams.Cluster, topic, username string) (*pb.AccountBackup, error) {
	var found *pb.AccountBackup
	err := streams.ReadToEnd(ctx, kc, topic, func(r *kgo.Record) error {
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

// IntentTTL is how long a restore's decision is kept: a request run
// again within it (after a crash) finds its uin instead of taking another.
const IntentTTL = 24 * time.Hour

// intent names one restore request's decision in Redis.
func (t *Tool) intent(requestID, username string) string {
	return uinkeys.Prefix(t.Namespace) + "restore:" + username + ":" + requestID
}

// Restore brings username back, for the request requestID. Run again for
// the same request (its first run crashed after some of its effects), it
// finishes that run's work on the uin that run chose; a new request for a
// live account is refused (ErrLive). It changes Redis only; the caller
// announces the result (Registration).
func (t *Tool) Restore(ctx context.Context, requestID, username string) (Result, error) {
	now := time.Now
	if t.Now != nil {
		now = t.Now
	}
	intent := t.intent(requestID, username)
	decided, err := t.Pool.Decided(ctx, intent)
	if err != nil {
		return Result{}, err
	}
	if u, live, err := t.Accounts.UinOf(ctx, username); err != nil {
		return Result{}, err
	} else if live && int64(u) != decided {
		return Result{}, fmt.Errorf("%w: %q is on uin %d; nothing to restore", ErrLive, username, u)
	}
	b, err := FindBackup(ctx, t.Kafka, t.Namespace+schemas.TopicBackups, username)
	if err != nil {
		return Result{}, err
	}
	res := Result{Username: username, OldUin: uint32(b.OldUin)}
	claimed, err := t.Pool.ClaimFor(ctx, intent, res.OldUin, IntentTTL)
	if err != nil {
		return res, err
	}
	if claimed >= 0 {
		res.Uin = uint32(claimed)
	} else if res.Uin, err = t.Pool.TakeFor(ctx, intent, rand.New(rand.NewPCG(uint64(now().UnixNano()), b.OldUin)), IntentTTL); err != nil {
		return res, fmt.Errorf("restore: old uin %d was reused and no new uin is available: %w", res.OldUin, err)
	}
	res.Reused = res.Uin != res.OldUin
	a, err := t.Accounts.FromBackup(ctx, b, res.Uin)
	if err != nil {
		return res, err
	}
	res.Friends = len(a.Friends)
	if err := t.Accounts.Create(ctx, a); err != nil {
		return res, err
	}
	return res, nil
}

// Registration announces a restored account on uin.registrations (channel
// "restore"), so the sinks, the tracker and the stock classification know
// who holds the uin.
func (t *Tool) Registration(res Result, at time.Time) *kgo.Record {
	rec, err := streams.NewRecord(t.Namespace+schemas.TopicRegistrations, schemas.UinKey(res.Uin), &pb.UinRegistration{
		Uin: uint64(res.Uin), Username: res.Username, Channel: tracker.ChannelRestore, Completed: true, AtMs: at.UnixMilli()})
	if err != nil {
		panic(err) // a registration always encodes
	}
	return rec
}
