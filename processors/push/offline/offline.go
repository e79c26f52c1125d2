// Package offline keeps the messages of users who were offline when their
// unit was sent, one queue per user in Pebble (the seed used LevelDB), and
// delivers them when the user's login event arrives. It consumes
// push.offline and push.login co-partitioned (range assignment over topics
// of equal partition counts), so the login of a uin and the batches holding
// it are always on the same instance.
//
// Pebble is a cache of the topics (every queued batch of push.offline,
// minus every DELIVERED_ON_LOGIN report). While running, a batch's Pebble
// writes are staged in an indexed batch and applied only once its Kafka
// transaction committed, together with the next offset of every input
// partition the batch read ("applied offsets"). On start, and whenever
// partitions are assigned, the applied offsets are compared with the
// group's committed ones: when they match, the store is exactly what the
// topics say and is used as it is (a restart in place reads nothing back);
// when any differs (a crash between the Kafka commit and Pebble's, or
// another instance consumed a partition meanwhile) the store is rebuilt
// from the topics.
package offline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"surge/schemas/uinset"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
	"surge/streams/metrics"
)

// Config configures the offline queues.
type Config struct {
	streams.Env
	Dir string // Pebble directory
}

// Queues is the processor.
type Queues struct {
	cfg Config
	db  *pebble.DB
	// open is db while Run has it open, for readers on other goroutines
	// (Pending) that may call before Run opened it or after it closed it;
	// openMu keeps Run from closing it under a reader.
	openMu sync.RWMutex
	open   *pebble.DB

	mu     sync.Mutex // guards staged, online, stale
	staged *pebble.Batch
	// stale: partitions were (re)assigned, so what this instance holds may
	// lag what their previous owner delivered: rebuild before the next record.
	stale  bool
	online *roaring.Bitmap
	onStg  map[uint32]bool

	// stgNext: the next offset of each input partition this batch read;
	// committed: the group's committed offsets of the partitions last
	// assigned, what a rebuild's applied offsets are set to.
	stgNext   map[topicPartition]int64
	committed map[topicPartition]int64

	queued, delivered  atomic.Int64
	stgQueued, stgDone int64
	mQueued, mDone     metrics.Counter
	// Rebuilds counts rebuilds of the store from the topics.
	Rebuilds atomic.Int64
}

type topicPartition struct {
	topic     string
	partition int32
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
}

// New returns the processor.
func New(cfg Config) *Queues {
	cfg.EnsureDefaults()
	c := cfg.Metrics.NewCounterVec("surge_push_offline_total", "offline messages", "event")
	return &Queues{cfg: cfg, online: roaring.New(), onStg: map[uint32]bool{}, stgNext: map[topicPartition]int64{},
		mQueued: c.With("queued"), mDone: c.With("delivered_on_login")}
}

// Stats returns messages queued and delivered on login by this process.
func (q *Queues) Stats() (queued, delivered int64) { return q.queued.Load(), q.delivered.Load() }

// offlineBatchSchema tells offline batches from delivery reports on the
// queue's inputs.
var offlineBatchSchema = schemas.Of(&pb.OfflineBatch{}).Name

// The store's keys: a queued message, an online user, an applied offset.
const (
	prefixEntry   = 'e' // uin (4 bytes) + job id
	prefixOnline  = 'o' // uin (4 bytes)
	prefixApplied = 'a' // topic + 0 + partition (4 bytes); value: next offset (8 bytes)
)

func entryKey(uin uint32, jobID string) []byte {
	return append(binary.BigEndian.AppendUint32(append(make([]byte, 0, 5+len(jobID)), prefixEntry), uin), jobID...)
}

func onlineKey(uin uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{prefixOnline}, uin)
}

func appliedKey(tp topicPartition) []byte {
	return binary.BigEndian.AppendUint32(append(append([]byte{prefixApplied}, tp.topic...), 0), uint32(tp.partition))
}

// Pending returns the job ids queued for uin (committed state).
func (q *Queues) Pending(uin uint32) ([]string, error) {
	q.openMu.RLock()
	defer q.openMu.RUnlock()
	db := q.open
	if db == nil {
		return nil, errors.New("offline: queues not open (Run has not started or has ended)")
	}
	var out []string
	err := q.scan(db, uin, func(k []byte, _ []byte) { out = append(out, string(k[5:])) })
	return out, err
}

type reader interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

func (q *Queues) scan(r reader, uin uint32, fn func(k, v []byte)) error {
	opts := &pebble.IterOptions{LowerBound: binary.BigEndian.AppendUint32([]byte{prefixEntry}, uin),
		UpperBound: []byte{prefixEntry + 1}}
	if uin != schemas.MaxUin {
		opts.UpperBound = binary.BigEndian.AppendUint32([]byte{prefixEntry}, uin+1)
	}
	it, err := r.NewIter(opts)
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		fn(it.Key(), it.Value())
	}
	return it.Close()
}

// Run rebuilds the queues and serves until ctx ends.
func (q *Queues) Run(ctx context.Context, opts ...streams.Option) error {
	// Kept across restarts (with its write-ahead log): whether it is
	// current is decided against the group's offsets on assignment.
	db, err := localstore.Open(q.cfg.Dir, false, q.cfg.Log)
	if err != nil {
		return err
	}
	q.db = db
	q.openMu.Lock()
	q.open = db
	q.openMu.Unlock()
	defer func() {
		q.openMu.Lock()
		q.open = nil
		q.openMu.Unlock()
		db.Close()
	}()
	q.staged = db.NewIndexedBatch()
	if err := q.loadOnline(); err != nil {
		return err
	}
	group := q.cfg.Namespace + "push-offline"
	opts = append([]streams.Option{
		streams.Kafka(q.cfg.Kafka),
		streams.Declare(Spec, q.cfg.Namespace),
		streams.DeadLetterTopic(q.cfg.Topic(schemas.TopicDeadLetter)),
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer()), // co-partitioned
			kgo.OnPartitionsAssigned(func(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
				current, err := q.current(ctx, cl, group, assigned)
				if err != nil {
					q.cfg.Log.Warn("offline: cannot compare the store with the group's offsets; rebuilding", "err", err)
				}
				q.mu.Lock()
				q.stale = q.stale || !current
				q.mu.Unlock()
			})),
		streams.OnBatchEnd(q.batchEnd),
	}, opts...)
	r, err := streams.New("push-offline", q.Handle(), opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// current tells whether the store holds exactly what the topics say for
// the assigned partitions: each one's applied offset is the group's
// committed offset. It remembers the committed offsets for a rebuild.
func (q *Queues) current(ctx context.Context, cl *kgo.Client, group string, assigned map[string][]int32) (bool, error) {
	fetched, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err == nil {
		err = fetched.Error()
	}
	if err != nil {
		return false, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.committed = map[topicPartition]int64{}
	current := true
	for topic, parts := range assigned {
		for _, p := range parts {
			tp := topicPartition{topic, p}
			committed := int64(-1)
			if o, ok := fetched.Lookup(topic, p); ok && o.Err == nil {
				committed = o.At
			}
			q.committed[tp] = committed
			applied, ok, err := q.applied(tp)
			if err != nil {
				return false, err
			}
			if committed < 0 && !ok {
				continue // never consumed by anyone: nothing to disagree on
			}
			if !ok || applied != committed {
				current = false
			}
		}
	}
	return current, nil
}

func (q *Queues) applied(tp topicPartition) (int64, bool, error) {
	v, closer, err := q.db.Get(appliedKey(tp))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, false, nil
	}
	return int64(binary.BigEndian.Uint64(v)), true, nil
}

// loadOnline reads the online users the store holds.
func (q *Queues) loadOnline() error {
	q.online = roaring.New()
	it, err := q.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixOnline}, UpperBound: []byte{prefixOnline + 1}})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		if k := it.Key(); len(k) == 5 {
			q.online.Add(binary.BigEndian.Uint32(k[1:]))
		}
	}
	return it.Close()
}

// rebuild empties the store and restores it from the topics; its applied
// offsets become the group's committed ones (records after them that the
// rebuild already reflects are applied again on top, which changes
// nothing: a queued message is set again, a delivered one is gone).
func (q *Queues) rebuild(ctx context.Context) error {
	q.Rebuilds.Add(1)
	start := time.Now()
	b := q.db.NewBatch()
	_ = b.DeleteRange([]byte{0}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	q.online = roaring.New()
	_ = q.staged.Close()
	q.staged = q.db.NewIndexedBatch()
	n, err := q.restore(ctx)
	if err != nil {
		return fmt.Errorf("offline: restore: %w", err)
	}
	q.cfg.Log.Info("offline: queues rebuilt", "entries", n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func (q *Queues) restore(ctx context.Context) (int, error) {
	b := q.db.NewBatch()
	n := 0
	flush := func() error {
		if b.Count() < 100000 {
			return nil
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		b = q.db.NewBatch()
		return nil
	}
	err := streams.ReadToEnd(ctx, q.cfg.Kafka, q.cfg.Topic(schemas.TopicOffline), func(r *kgo.Record) error {
		var ob pb.OfflineBatch
		if streams.Decode(r, &ob) != nil {
			return nil
		}
		set, err := uinset.Decode(ob.Uins)
		if err != nil {
			return nil
		}
		it := set.Iterator()
		for it.HasNext() {
			uin := it.Next()
			v, _ := proto.Marshal(entry(&ob, uin))
			_ = b.Set(entryKey(uin, ob.JobId), v, nil)
			n++
		}
		return flush()
	})
	if err != nil {
		return 0, err
	}
	err = streams.ReadToEnd(ctx, q.cfg.Kafka, q.cfg.Topic(schemas.TopicReports), func(r *kgo.Record) error {
		var rep pb.DeliveryReport
		if streams.Decode(r, &rep) == nil && rep.Status == pb.DeliveryStatus_DELIVERED_ON_LOGIN {
			_ = b.Delete(entryKey(uint32(rep.Uin), rep.JobId), nil)
			n--
		}
		return flush()
	})
	if err != nil {
		return 0, err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return 0, err
	}
	err = streams.ReadToEnd(ctx, q.cfg.Kafka, q.cfg.Topic(schemas.TopicPresence), func(r *kgo.Record) error {
		var ev pb.LoginEvent
		if streams.Decode(r, &ev) == nil && ev.Uin <= schemas.MaxUin {
			if ev.Online {
				q.online.Add(uint32(ev.Uin))
			} else {
				q.online.Remove(uint32(ev.Uin))
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	b = q.db.NewBatch()
	it := q.online.Iterator()
	for it.HasNext() {
		_ = b.Set(onlineKey(it.Next()), nil, nil)
		if err := flush(); err != nil {
			return 0, err
		}
	}
	for tp, o := range q.committed {
		if o >= 0 {
			_ = b.Set(appliedKey(tp), binary.BigEndian.AppendUint64(nil, uint64(o)), nil)
		}
	}
	return n, b.Commit(pebble.Sync)
}

func entry(ob *pb.OfflineBatch, uin uint32) *pb.OfflineEntry {
	return &pb.OfflineEntry{JobId: ob.JobId, Uin: uin, ContentId: ob.ContentId, DisplayAtMs: ob.DisplayAtMs,
		QueuedAtMs: ob.AtMs, UnitId: ob.UnitId}
}

func (q *Queues) isOnline(uin uint32) bool {
	if v, ok := q.onStg[uin]; ok {
		return v
	}
	return q.online.Contains(uin)
}

// Handle is the handler over push.offline and push.login.
func (q *Queues) Handle() streams.Handler {
	return func(ctx context.Context, in *kgo.Record, out *streams.Output) error {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.stale {
			if err := q.rebuild(ctx); err != nil {
				return err
			}
			q.stale = false
		}
		q.stgNext[topicPartition{in.Topic, in.Partition}] = in.Offset + 1
		now := time.Now().UnixMilli()
		deliver := func(e *pb.OfflineEntry) error {
			q.stgDone++
			return out.EmitMsg(q.cfg.Topic(schemas.TopicReports), []byte(e.JobId), &pb.DeliveryReport{
				JobId: e.JobId, Uin: uint64(e.Uin), Status: pb.DeliveryStatus_DELIVERED_ON_LOGIN, AtMs: now,
				UnitId: e.UnitId, DisplayAtMs: e.DisplayAtMs, ContentId: e.ContentId, Executor: "offline"})
		}
		if streams.HasSchema(in, offlineBatchSchema) {
			var ob pb.OfflineBatch
			if err := streams.Decode(in, &ob); err != nil {
				return err
			}
			set, err := uinset.Decode(ob.Uins)
			if err != nil {
				return streams.Reject("offline batch with unreadable uins", err)
			}
			it := set.Iterator()
			for it.HasNext() {
				uin := it.Next()
				e := entry(&ob, uin)
				if q.isOnline(uin) { // logged in since the executor looked
					if err := deliver(e); err != nil {
						return err
					}
					// A rebuild that read this batch queued it: delivered
					// now, it must not be delivered again on a later login.
					if err := q.staged.Delete(entryKey(uin, ob.JobId), nil); err != nil {
						return err
					}
					continue
				}
				v, _ := proto.Marshal(e)
				if err := q.staged.Set(entryKey(uin, ob.JobId), v, nil); err != nil {
					return err
				}
				q.stgQueued++
			}
			return nil
		}
		var ev pb.LoginEvent
		if err := streams.Decode(in, &ev); err != nil {
			return err
		}
		if ev.Uin > schemas.MaxUin {
			return streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", ev.Uin), nil)
		}
		uin := uint32(ev.Uin)
		q.onStg[uin] = ev.Online
		if !ev.Online {
			return nil
		}
		var keys [][]byte
		var firstErr error
		err := q.scan(q.staged, uin, func(k, v []byte) {
			var e pb.OfflineEntry
			if proto.Unmarshal(v, &e) != nil {
				return
			}
			if err := deliver(&e); err != nil && firstErr == nil {
				firstErr = err
			}
			keys = append(keys, append([]byte(nil), k...))
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			_ = q.staged.Delete(k, nil)
		}
		return firstErr
	}
}

// batchEnd applies the staged writes when the batch committed and drops
// them when it aborted (the runtime then replays the batch).
func (q *Queues) batchEnd(committed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if committed {
		q.queued.Add(q.stgQueued)
		q.delivered.Add(q.stgDone)
		q.mQueued.Add(float64(q.stgQueued))
		q.mDone.Add(float64(q.stgDone))
		for uin, on := range q.onStg {
			if on {
				_ = q.staged.Set(onlineKey(uin), nil, nil)
			} else {
				_ = q.staged.Delete(onlineKey(uin), nil)
			}
		}
		for tp, next := range q.stgNext {
			_ = q.staged.Set(appliedKey(tp), binary.BigEndian.AppendUint64(nil, uint64(next)), nil)
		}
		// The batch's writes and the offsets they reach, atomically: after
		// a crash the store is either as of this commit or as of the last.
		if err := q.staged.Commit(pebble.NoSync); err != nil {
			// Pebble refused a write: the cache no longer matches the
			// topics. Stop; the restart rebuilds it from them.
			q.cfg.Log.Error("offline: pebble commit failed; exiting for a rebuild", "err", err)
			panic(err)
		}
		for uin, on := range q.onStg {
			if on {
				q.online.Add(uin)
			} else {
				q.online.Remove(uin)
			}
		}
	} else {
		_ = q.staged.Close()
	}
	clear(q.onStg)
	clear(q.stgNext)
	q.stgQueued, q.stgDone = 0, 0
	q.staged = q.db.NewIndexedBatch()
}
