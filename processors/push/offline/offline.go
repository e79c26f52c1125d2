// Package offline keeps the messages of users who were offline when their
// unit was sent, one queue per user in Pebble (the seed used LevelDB), and
// delivers them when the user's login event arrives. It consumes
// push.offline and push.login co-partitioned (range assignment over topics
// of equal partition counts), so the login of a uin and the batches holding
// it are always on the same instance.
//
// Pebble is a cache: on start it is rebuilt from the topics (every queued
// batch of push.offline, minus every DELIVERED_ON_LOGIN report). While
// running, a batch's Pebble writes are staged in an indexed batch and
// applied only once its Kafka transaction committed; a crash in between
// loses nothing, because the restart rebuilds from what committed.
package offline

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/presence"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
	"surge/streams/metrics"
)

// Config configures the offline queues.
type Config struct {
	Namespace string
	Dir       string // Pebble directory
	Log       *slog.Logger
	Metrics   *metrics.Registry
}

// Queues is the processor.
type Queues struct {
	cfg     Config
	brokers []string
	db      *pebble.DB

	mu     sync.Mutex // guards staged, online, stale
	staged *pebble.Batch
	// stale: partitions were (re)assigned, so what this instance holds may
	// lag what their previous owner delivered: rebuild before the next record.
	stale  bool
	online *roaring.Bitmap
	onStg  map[uint32]bool

	queued, delivered  atomic.Int64
	stgQueued, stgDone int64
	mQueued, mDone     metrics.Counter
}

// New returns the processor.
func New(cfg Config, brokers []string) *Queues {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewRegistry()
	}
	c := cfg.Metrics.NewCounterVec("surge_push_offline_total", "offline messages", "event")
	return &Queues{cfg: cfg, brokers: brokers, online: roaring.New(), onStg: map[uint32]bool{},
		mQueued: c.With("queued"), mDone: c.With("delivered_on_login")}
}

func (q *Queues) topic(name string) string { return q.cfg.Namespace + name }

// Stats returns messages queued and delivered on login by this process.
func (q *Queues) Stats() (queued, delivered int64) { return q.queued.Load(), q.delivered.Load() }

// offlineBatchSchema tells offline batches from delivery reports on the
// queue's inputs.
var offlineBatchSchema = schemas.Of(&pb.OfflineBatch{}).Name

func entryKey(uin uint32, jobID string) []byte {
	return append(binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(jobID)), uin), jobID...)
}

// Pending returns the job ids queued for uin (committed state).
func (q *Queues) Pending(uin uint32) ([]string, error) {
	var out []string
	err := q.scan(q.db, uin, func(k []byte, _ []byte) { out = append(out, string(k[4:])) })
	return out, err
}

type reader interface {
	NewIter(*pebble.IterOptions) (*pebble.Iterator, error)
}

func (q *Queues) scan(r reader, uin uint32, fn func(k, v []byte)) error {
	lo := binary.BigEndian.AppendUint32(nil, uin)
	hi := binary.BigEndian.AppendUint32(nil, uin+1)
	opts := &pebble.IterOptions{LowerBound: lo}
	if uin != presence.MaxUin {
		opts.UpperBound = hi
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
	db, err := localstore.Open(q.cfg.Dir, true, q.cfg.Log)
	if err != nil {
		return err
	}
	q.db = db
	defer db.Close()
	q.staged = db.NewIndexedBatch()
	q.stale = true
	opts = append([]streams.Option{
		streams.Brokers(q.brokers...),
		streams.Inputs(q.topic(schemas.TopicOffline), q.topic(schemas.TopicLogin)),
		streams.Group(q.cfg.Namespace + "push-offline"),
		streams.WithGuarantee(streams.ExactlyOnce),
		streams.DeadLetterTopic(q.topic(schemas.TopicDeadLetter)),
		streams.ClientOpts(kgo.Balancers(kgo.RangeBalancer()), // co-partitioned
			kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
				q.mu.Lock()
				q.stale = true
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

// rebuild empties the store and restores it from the topics.
func (q *Queues) rebuild(ctx context.Context) error {
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
	err := streams.ReadToEnd(ctx, q.brokers, q.topic(schemas.TopicOffline), func(r *kgo.Record) error {
		var ob pb.OfflineBatch
		if streams.Decode(r, &ob) != nil {
			return nil
		}
		set := roaring.New()
		if set.UnmarshalBinary(ob.Uins) != nil {
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
	err = streams.ReadToEnd(ctx, q.brokers, q.topic(schemas.TopicReports), func(r *kgo.Record) error {
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
	err = streams.ReadToEnd(ctx, q.brokers, q.topic(schemas.TopicPresence), func(r *kgo.Record) error {
		var ev pb.LoginEvent
		if streams.Decode(r, &ev) == nil && ev.Uin <= presence.MaxUin {
			if ev.Online {
				q.online.Add(uint32(ev.Uin))
			} else {
				q.online.Remove(uint32(ev.Uin))
			}
		}
		return nil
	})
	return n, err
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
		now := time.Now().UnixMilli()
		deliver := func(e *pb.OfflineEntry) error {
			q.stgDone++
			return out.EmitMsg(q.topic(schemas.TopicReports), []byte(e.JobId), &pb.DeliveryReport{
				JobId: e.JobId, Uin: uint64(e.Uin), Status: pb.DeliveryStatus_DELIVERED_ON_LOGIN, AtMs: now,
				UnitId: e.UnitId, DisplayAtMs: e.DisplayAtMs, ContentId: e.ContentId, Executor: "offline"})
		}
		if streams.HasSchema(in, offlineBatchSchema) {
			var ob pb.OfflineBatch
			if err := streams.Decode(in, &ob); err != nil {
				return err
			}
			set := roaring.New()
			if err := set.UnmarshalBinary(ob.Uins); err != nil {
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
		if ev.Uin > presence.MaxUin {
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
	q.stgQueued, q.stgDone = 0, 0
	q.staged = q.db.NewIndexedBatch()
}
