// Package directory is what the push planner knows of the platform: the
// public-account registry, every account's follower list, the targeting
// tags and the blacklists. Each is a compacted topic that other teams
// publish to (push.accounts, push.fan-delta, push.tags, push.blacklists);
// the directory is their materialised view, in roaring bitmaps, rebuilt by
// replaying the topics (Restore) and kept current by the planner, which
// consumes them as inputs and dead-letters what it cannot read (Apply).
package directory

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/push/filter"
	"surge/processors/push/internal/fanlist"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Account is what the planner knows of a public account.
type Account struct {
	ID        uint64
	Type      string
	Filters   filter.Bit // the filters on when a job sets no mask
	Followers uint64     // as the platform reports it
	DailyJobs uint32     // jobs a day it may send; 0 = no limit
}

// Directory is the set of views. Its maps are replaced whole by Restore,
// so readers take them through the accessors.
type Directory struct {
	ns string

	mu         sync.RWMutex
	accounts   map[uint64]Account
	followers  *fanlist.Lists
	mirror     *fanlist.Mirror
	tags       *filter.Tags
	blacklists *filter.Blacklists
	// lastDelivery is each account's latest completed job's click-through
	// (push.job-clicks): the planner's quota follows it.
	lastDelivery map[uint64]*pb.JobClicks
	// applied is the last offset applied per topic and partition: a record
	// the planner consumes again after Restore read past it is not applied
	// twice (an older value must not overwrite a newer one).
	applied map[topicPartition]int64
	// readTo is where CatchUp last read each partition up to: the
	// offsets past the last record there are transaction markers (a
	// publisher writing in transactions), which a read ahead would
	// otherwise wait out again at every job.
	readTo map[topicPartition]int64
}

type topicPartition struct {
	topic     string
	partition int32
}

// New returns an empty directory over the topics behind namespace ns.
func New(ns string) *Directory {
	d := &Directory{ns: ns}
	d.clear()
	return d
}

func (d *Directory) clear() {
	d.accounts = map[uint64]Account{}
	d.followers = fanlist.NewLists()
	d.mirror = fanlist.NewMirror(nil)
	d.tags = filter.NewTags()
	d.blacklists = filter.NewBlacklists()
	d.lastDelivery = map[uint64]*pb.JobClicks{}
	d.applied = map[topicPartition]int64{}
	d.readTo = map[topicPartition]int64{}
}

// Inputs are the topics the directory is built from (registry names):
// its owner consumes them and hands each record to Apply.
var Inputs = []string{schemas.TopicAccounts, schemas.TopicFanDelta, schemas.TopicTags, schemas.TopicBlacklists, schemas.TopicJobClicks}

// Topics are the directory's input topics (namespaced).
func (d *Directory) Topics() []string {
	out := make([]string, len(Inputs))
	for i, t := range Inputs {
		out[i] = d.ns + t
	}
	return out
}

// LastDelivery is the account's latest completed job's click counts.
func (d *Directory) LastDelivery(account uint64) (*pb.JobClicks, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	j, ok := d.lastDelivery[account]
	return j, ok
}

// Owns reports whether topic is one of the directory's inputs.
func (d *Directory) Owns(topic string) bool {
	for _, t := range d.Topics() {
		if t == topic {
			return true
		}
	}
	return false
}

// Account returns a registered account.
func (d *Directory) Account(id uint64) (Account, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	a, ok := d.accounts[id]
	return a, ok
}

// Followers is the follower lists (the source store).
func (d *Directory) Followers() *fanlist.Lists {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.followers
}

// Mirror is the local fan-list mirror of the big accounts.
func (d *Directory) Mirror() *fanlist.Mirror {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.mirror
}

// Tags is the tag index.
func (d *Directory) Tags() *filter.Tags {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.tags
}

// Blacklists are the global and per-account blacklists.
func (d *Directory) Blacklists() *filter.Blacklists {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.blacklists
}

// Restore rebuilds every view from its topic, from the start to the end
// offsets seen now. Records it cannot read are skipped here; the planner
// dead-letters them when it consumes them.
func (d *Directory) Restore(ctx context.Context, kc streams.Cluster) error {
	d.mu.Lock()
	d.clear()
	d.mu.Unlock()
	for _, topic := range d.Topics() {
		err := streams.ReadToEnd(ctx, kc, topic, func(r *kgo.Record) error {
			_ = d.Apply(r)
			return nil
		})
		if err != nil {
			return fmt.Errorf("directory: restore %s: %w", topic, err)
		}
	}
	return nil
}

// CatchUp makes the views read-your-writes for a job: it applies, ahead
// of the planner's own consumer, every record of the directory's topics
// below the committed end offsets listed now (adm lists them), so a job
// sees every follow, account, tag and blacklist change published before
// it. The planner consumes jobs and these topics in one group with no
// order between them; without this a job published right after 50,000
// follows could be planned with part of them. Records read ahead are not
// applied again when the consumer reaches them (applied); those it cannot
// read are skipped here and dead-lettered there. It returns how many
// records it read ahead.
func (d *Directory) CatchUp(ctx context.Context, kc streams.Cluster, adm *kadm.Client) (int, error) {
	ends, err := adm.ListCommittedOffsets(ctx, d.changeTopics()...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("directory: end offsets: %w", err)
	}
	from := map[string]map[int32]int64{}
	to := map[string]map[int32]int64{}
	d.mu.RLock()
	ends.Each(func(o kadm.ListedOffset) {
		tp := topicPartition{o.Topic, o.Partition}
		next := d.readTo[tp] // nothing applied: from the start (Restore read it, or it is empty)
		if last, ok := d.applied[tp]; ok {
			next = max(next, last+1)
		}
		if next >= o.Offset {
			return
		}
		if from[o.Topic] == nil {
			from[o.Topic], to[o.Topic] = map[int32]int64{}, map[int32]int64{}
		}
		from[o.Topic][o.Partition], to[o.Topic][o.Partition] = next, o.Offset
	})
	d.mu.RUnlock()
	if len(to) == 0 {
		return 0, nil
	}
	n := 0
	err = streams.ReadRanges(ctx, kc, from, to, func(r *kgo.Record) error {
		if d.Apply(r) == nil {
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("directory: catch up: %w", err)
	}
	d.mu.Lock()
	for topic, ps := range to {
		for p, end := range ps {
			d.readTo[topicPartition{topic, p}] = end
		}
	}
	d.mu.Unlock()
	return n, nil
}

// changeTopics are the topics whose changes a job must see: the platform's
// accounts, follows, tags and blacklists (not the planner's own
// click-through feedback).
func (d *Directory) changeTopics() []string {
	return []string{d.ns + schemas.TopicAccounts, d.ns + schemas.TopicFanDelta, d.ns + schemas.TopicTags, d.ns + schemas.TopicBlacklists}
}

// Apply applies one record of an input topic. A record that cannot be
// read returns a *streams.RejectError saying why; one applied already is
// checked but not applied again.
func (d *Directory) Apply(r *kgo.Record) error {
	change, err := d.decode(r)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	tp := topicPartition{r.Topic, r.Partition}
	if last, ok := d.applied[tp]; ok && r.Offset <= last {
		return nil
	}
	d.applied[tp] = r.Offset
	change(d)
	return nil
}

// decode validates a record into the change it makes.
func (d *Directory) decode(r *kgo.Record) (func(*Directory), error) {
	base := strings.TrimPrefix(r.Topic, d.ns)
	tombstone := r.Value == nil
	switch base {
	case schemas.TopicAccounts:
		if tombstone {
			id, err := strconv.ParseUint(string(r.Key), 10, 64)
			if err != nil {
				return nil, streams.Reject(fmt.Sprintf("account tombstone with key %q (want the account id)", r.Key), nil)
			}
			return func(d *Directory) { delete(d.accounts, id) }, nil
		}
		var a pb.AccountInfo
		if err := streams.Decode(r, &a); err != nil {
			return nil, err
		}
		if a.AccountId == 0 {
			return nil, streams.Reject("account without an account id", nil)
		}
		acc := Account{ID: a.AccountId, Type: a.Type, Filters: filter.All, Followers: a.Followers, DailyJobs: a.DailyJobs}
		if a.Filters != nil {
			if *a.Filters&^uint32(filter.All) != 0 {
				return nil, streams.Reject(fmt.Sprintf("account %d: unknown filter bits %#x", a.AccountId, *a.Filters&^uint32(filter.All)), nil)
			}
			acc.Filters = filter.Bit(*a.Filters)
		}
		if a.Deleted {
			return func(d *Directory) { delete(d.accounts, acc.ID) }, nil
		}
		return func(d *Directory) {
			d.accounts[acc.ID] = acc
			d.followers.AddAccount(acc.ID)
		}, nil
	case schemas.TopicJobClicks:
		if tombstone {
			return func(*Directory) {}, nil
		}
		var jc pb.JobClicks
		if err := streams.Decode(r, &jc); err != nil {
			return nil, err
		}
		if jc.JobId == "" || jc.AccountId == 0 {
			return nil, streams.Reject("job clicks without a job or an account", nil)
		}
		return func(d *Directory) {
			if jc.CompletedAtMs == 0 {
				return // still running: not yet a delivery to judge by
			}
			cur, ok := d.lastDelivery[jc.AccountId]
			if !ok || cur.JobId == jc.JobId || jc.CompletedAtMs >= cur.CompletedAtMs {
				d.lastDelivery[jc.AccountId] = &jc
			}
		}, nil
	case schemas.TopicFanDelta:
		if tombstone {
			acc, uin, err := keyPair(r.Key)
			if err != nil {
				return nil, err
			}
			return func(d *Directory) { d.applyFan(&pb.FanDelta{AccountId: acc, Uin: uin, Op: pb.FanDelta_UNFOLLOW}) }, nil
		}
		var f pb.FanDelta
		if err := streams.Decode(r, &f); err != nil {
			return nil, err
		}
		switch {
		case f.Uin > math.MaxUint32:
			return nil, streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", f.Uin), nil)
		case f.AccountId == 0:
			return nil, streams.Reject("fan delta without an account id", nil)
		case f.Op != pb.FanDelta_FOLLOW && f.Op != pb.FanDelta_UNFOLLOW:
			return nil, streams.Reject(fmt.Sprintf("fan delta with op %v (FOLLOW or UNFOLLOW)", f.Op), nil)
		}
		return func(d *Directory) { d.applyFan(&f) }, nil
	case schemas.TopicTags:
		if tombstone {
			i := strings.LastIndexByte(string(r.Key), '/')
			uin, err := strconv.ParseUint(string(r.Key[i+1:]), 10, 32)
			if i <= 0 || err != nil {
				return nil, streams.Reject(fmt.Sprintf("tag tombstone with key %q (want tag/uin)", r.Key), nil)
			}
			tag := string(r.Key[:i])
			return func(d *Directory) { d.tags.Untag(tag, uint32(uin)) }, nil
		}
		var t pb.TagChange
		if err := streams.Decode(r, &t); err != nil {
			return nil, err
		}
		switch {
		case t.Tag == "":
			return nil, streams.Reject("tag change without a tag", nil)
		case t.Uin > math.MaxUint32:
			return nil, streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", t.Uin), nil)
		}
		if t.Removed {
			return func(d *Directory) { d.tags.Untag(t.Tag, uint32(t.Uin)) }, nil
		}
		return func(d *Directory) { d.tags.Tag(t.Tag, uint32(t.Uin)) }, nil
	case schemas.TopicBlacklists:
		if tombstone {
			acc, uin, err := keyPair(r.Key)
			if err != nil {
				return nil, err
			}
			return func(d *Directory) { d.blacklists.Remove(acc, uint32(uin)) }, nil
		}
		var b pb.BlacklistChange
		if err := streams.Decode(r, &b); err != nil {
			return nil, err
		}
		if b.Uin > math.MaxUint32 {
			return nil, streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", b.Uin), nil)
		}
		if b.Removed {
			return func(d *Directory) { d.blacklists.Remove(b.AccountId, uint32(b.Uin)) }, nil
		}
		return func(d *Directory) { d.blacklists.Add(b.AccountId, uint32(b.Uin)) }, nil
	}
	return nil, streams.Reject(fmt.Sprintf("directory: %s is not a directory topic", r.Topic), nil)
}

func (d *Directory) applyFan(f *pb.FanDelta) {
	d.followers.Apply(f)
	d.mirror.Apply(f)
}

// keyPair parses a key "a/b" of two decimal numbers (b a 32-bit uin).
func keyPair(key []byte) (uint64, uint64, error) {
	a, b, ok := strings.Cut(string(key), "/")
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, streams.Reject(fmt.Sprintf("tombstone with key %q (want account/uin)", key), nil)
	}
	return x, y, nil
}

// Key helpers: how producers key each directory topic.

// AccountKey keys push.accounts.
func AccountKey(id uint64) []byte { return strconv.AppendUint(nil, id, 10) }

// PairKey keys push.fan-delta and push.blacklists: "account/uin".
func PairKey(account uint64, uin uint32) []byte {
	return strconv.AppendUint(append(strconv.AppendUint(nil, account, 10), '/'), uint64(uin), 10)
}

// TagKey keys push.tags: "tag/uin".
func TagKey(tag string, uin uint32) []byte {
	return strconv.AppendUint(append([]byte(tag), '/'), uint64(uin), 10)
}

// Records a platform publishes to the directory's topics (namespace ns).

// AccountRecord registers or updates an account on push.accounts.
func AccountRecord(ns string, a *pb.AccountInfo) *kgo.Record {
	return mustRecord(ns+schemas.TopicAccounts, AccountKey(a.AccountId), a)
}

// FollowRecord is a follow (or, with follow false, an unfollow) on push.fan-delta.
func FollowRecord(ns string, account uint64, uin uint32, follow bool) *kgo.Record {
	op := pb.FanDelta_FOLLOW
	if !follow {
		op = pb.FanDelta_UNFOLLOW
	}
	return mustRecord(ns+schemas.TopicFanDelta, PairKey(account, uin),
		&pb.FanDelta{AccountId: account, Uin: uint64(uin), Op: op, AtMs: time.Now().UnixMilli()})
}

// TagRecord gives (or with removed, takes) a tag on push.tags.
func TagRecord(ns, tag string, uin uint32, removed bool) *kgo.Record {
	return mustRecord(ns+schemas.TopicTags, TagKey(tag, uin),
		&pb.TagChange{Tag: tag, Uin: uint64(uin), Removed: removed, AtMs: time.Now().UnixMilli()})
}

// BlacklistRecord blacklists (or with removed, clears) a uin for an
// account (0: globally) on push.blacklists.
func BlacklistRecord(ns string, account uint64, uin uint32, removed bool) *kgo.Record {
	return mustRecord(ns+schemas.TopicBlacklists, PairKey(account, uin),
		&pb.BlacklistChange{AccountId: account, Uin: uint64(uin), Removed: removed, AtMs: time.Now().UnixMilli()})
}

func mustRecord(topic string, key []byte, m proto.Message) *kgo.Record {
	r, err := streams.NewRecord(topic, key, m)
	if err != nil {
		panic(err) // these messages always encode
	}
	return r
}
