// Package timer is the product's delay service: every "do this later" (a
// scheduled push job, a registration checkpoint, a recycle cool-down) is a
// Timer record on platform.timers, keyed by timer id. The topic is compacted
// and a fired or cancelled timer is tombstoned, so the topic itself is the
// set of pending timers and the service's Pebble store is only its cache,
// rebuilt by reading the topic on start.
//
// Firing is exactly once: the payload goes to its target topic in the same
// Kafka transaction as the timer's tombstone. A crash before the commit
// aborts both (the timer fires again later); after it, the restore reads the
// tombstone and never fires it again. The transactional id fences a second
// instance owning the same partitions.
package timer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
)

// HeaderTimerID names the timer a fired record came from.
const HeaderTimerID = "surge-timer-id"

// Schedule builds the record that arms timer id to deliver msg to target at
// fireAt. Re-arming an id replaces the pending timer.
func Schedule(id string, fireAt time.Time, target string, key []byte, msg proto.Message) (*kgo.Record, error) {
	payload, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	return streams.NewRecord(schemas.TopicTimers, []byte(id), &surgev1.Timer{
		TimerId:     id,
		FireAtMs:    fireAt.UnixMilli(),
		TargetTopic: target,
		Key:         key,
		Payload:     payload,
		Schema:      schemas.Of(msg).Name,
	})
}

// Cancel builds the record that cancels timer id (a tombstone).
func Cancel(id string) *kgo.Record {
	return &kgo.Record{Topic: schemas.TopicTimers, Key: []byte(id)}
}

// Config configures a timer service.
type Config struct {
	streams.Env
	// Topic is the timer topic (default: platform.timers in the namespace).
	Topic string
	// Dir is the Pebble directory (wiped and rebuilt on start; default a
	// temporary one).
	Dir string
	// TransactionalID fences another instance of the same shard (default
	// surge-timer).
	TransactionalID string
	// Targets limits the service to the timers whose target topic starts
	// with one of these prefixes (default: all). Services of different
	// systems share one timer topic this way, each firing only its own
	// system's timers under its own TransactionalID: two services firing
	// every timer would fire each one twice, and two under one id would
	// fence each other.
	Targets []string
	// Partitions limits the service to some partitions of the topic, so
	// several instances can share millions of timers (default all).
	Partitions []int32
	// MaxFirePerTxn bounds one firing transaction (default 5000).
	MaxFirePerTxn int
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Topic == "" {
		c.Topic = c.Env.Topic(schemas.TopicTimers)
	}
	if c.TransactionalID == "" {
		c.TransactionalID = "surge-timer"
	}
	if c.MaxFirePerTxn <= 0 {
		c.MaxFirePerTxn = 5000
	}
}

// Service fires due timers.
type Service struct {
	cfg     Config
	db      *pebble.DB
	pending atomic.Int64
	fired   atomic.Int64
	live    atomic.Bool

	restore *streams.CatchUp // how far the restore has read
}

// New returns a service; Run starts it.
func New(cfg Config) *Service {
	cfg.EnsureDefaults()
	return &Service{cfg: cfg}
}

// Pending is the number of armed timers.
func (s *Service) Pending() int64 { return s.pending.Load() }

// Fired is the number of timers fired by this instance.
func (s *Service) Fired() int64 { return s.fired.Load() }

// Live reports whether the restore finished and timers are firing.
func (s *Service) Live() bool { return s.live.Load() }

// Keys: 'd' fireAt(8) id -> Timer bytes (the due index), 'i' id -> fireAt(8).
func dueKey(at int64, id string) []byte {
	k := make([]byte, 0, 9+len(id))
	k = append(k, 'd')
	k = binary.BigEndian.AppendUint64(k, uint64(at))
	return append(k, id...)
}

func idKey(id string) []byte { return append([]byte{'i'}, id...) }

// Run restores the pending set and fires timers until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	dir := s.cfg.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "surge-timer-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	db, err := localstore.Open(dir, true, s.cfg.Log)
	if err != nil {
		return err
	}
	s.db = db
	defer db.Close()

	consume := kgo.ConsumeTopics(s.cfg.Topic)
	if len(s.cfg.Partitions) > 0 {
		ps := map[int32]kgo.Offset{}
		for _, p := range s.cfg.Partitions {
			ps[p] = kgo.NewOffset().AtStart()
		}
		consume = kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.cfg.Topic: ps})
	}
	in, err := s.cfg.Kafka.NewClient(consume,
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := s.cfg.Kafka.NewClient(kgo.TransactionalID(s.cfg.TransactionalID),
		kgo.TransactionTimeout(30*time.Second))
	if err != nil {
		return err
	}
	defer out.Close()

	ends, err := s.endOffsets(ctx, in)
	if err != nil {
		return err
	}
	s.restore = streams.NewCatchUp(ends)
	publish := s.publishMetrics()
	for ctx.Err() == nil {
		publish()
		wait := 200 * time.Millisecond
		if s.live.Load() {
			if next, ok := s.nextDue(); ok {
				if d := time.Duration(next-s.cfg.Now().UnixMilli()) * time.Millisecond; d < wait {
					wait = max(d, time.Millisecond)
				}
			}
		}
		pctx, cancel := context.WithTimeout(ctx, wait)
		fs := in.PollRecords(pctx, 10000)
		cancel()
		if err := s.apply(fs); err != nil {
			return err
		}
		if !s.live.Load() && s.restore.Done() {
			s.live.Store(true)
			s.cfg.Log.Info("timer: restored", "pending", s.pending.Load())
		}
		if s.live.Load() {
			if err := s.fireDue(ctx, out); err != nil && ctx.Err() == nil {
				s.cfg.Log.Warn("timer: fire failed; retrying", "err", err)
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	return nil
}

func (s *Service) endOffsets(ctx context.Context, cl *kgo.Client) (map[int32]int64, error) {
	ends, err := streams.EndOffsets(ctx, cl, s.cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("timer: end offsets of %s: %w", s.cfg.Topic, err)
	}
	if len(s.cfg.Partitions) > 0 {
		owned := map[int32]bool{}
		for _, p := range s.cfg.Partitions {
			owned[p] = true
		}
		for p := range ends {
			if !owned[p] {
				delete(ends, p)
			}
		}
	}
	return ends, nil
}

// apply writes polled timer records into the store.
func (s *Service) apply(fs kgo.Fetches) error {
	b := s.db.NewIndexedBatch() // so a cancel sees an arm earlier in the batch
	defer b.Close()
	var applyErr error
	fs.EachRecord(func(r *kgo.Record) {
		if applyErr != nil {
			return
		}
		s.restore.Saw(r)
		id := string(r.Key)
		if err := s.remove(b, id); err != nil {
			applyErr = err
			return
		}
		if r.Value == nil {
			return // fired or cancelled
		}
		var t surgev1.Timer
		if err := streams.Decode(r, &t); err != nil || t.Cancel || t.TimerId != id {
			if err != nil {
				s.cfg.Log.Warn("timer: unreadable timer ignored", "id", id, "err", err)
			}
			return
		}
		if !s.owns(t.TargetTopic) {
			return // another system's timer service fires it
		}
		v, _ := proto.Marshal(&t)
		_ = b.Set(dueKey(t.FireAtMs, id), v, nil)
		_ = b.Set(idKey(id), binary.BigEndian.AppendUint64(nil, uint64(t.FireAtMs)), nil)
		s.pending.Add(1)
	})
	if applyErr != nil {
		return applyErr
	}
	s.restore.Polled(fs.NumRecords())
	return b.Commit(pebble.NoSync)
}

func (s *Service) owns(target string) bool {
	if len(s.cfg.Targets) == 0 {
		return true
	}
	for _, p := range s.cfg.Targets {
		if strings.HasPrefix(target, p) {
			return true
		}
	}
	return false
}

func (s *Service) remove(b *pebble.Batch, id string) error {
	var get func([]byte) ([]byte, io.Closer, error) = s.db.Get
	if b.Indexed() {
		get = b.Get
	}
	v, closer, err := get(idKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	at := int64(binary.BigEndian.Uint64(v))
	closer.Close()
	_ = b.Delete(dueKey(at, id), nil)
	_ = b.Delete(idKey(id), nil)
	s.pending.Add(-1)
	return nil
}

func (s *Service) nextDue() (int64, bool) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{'d'}, UpperBound: []byte{'e'}})
	if err != nil {
		return 0, false
	}
	defer it.Close()
	if !it.First() {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(it.Key()[1:9])), true
}

// fireDue fires due timers in transactions of at most maxFire each.
func (s *Service) fireDue(ctx context.Context, out *kgo.Client) error {
	for ctx.Err() == nil {
		now := s.cfg.Now().UnixMilli()
		upper := dueKey(now+1, "")
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{'d'}, UpperBound: upper})
		if err != nil {
			return err
		}
		var due []*surgev1.Timer
		for ok := it.First(); ok && len(due) < s.cfg.MaxFirePerTxn; ok = it.Next() {
			t := new(surgev1.Timer)
			if err := proto.Unmarshal(it.Value(), t); err == nil {
				due = append(due, t)
			}
		}
		it.Close()
		if len(due) == 0 {
			return nil
		}
		if err := s.fire(ctx, out, due); err != nil {
			return err
		}
		b := s.db.NewBatch()
		for _, t := range due {
			if err := s.remove(b, t.TimerId); err != nil {
				b.Close()
				return err
			}
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		s.fired.Add(int64(len(due)))
		if len(due) < s.cfg.MaxFirePerTxn {
			return nil
		}
	}
	return nil
}

func (s *Service) fire(ctx context.Context, out *kgo.Client, due []*surgev1.Timer) error {
	if err := out.BeginTransaction(); err != nil {
		return err
	}
	var produceErr atomic.Value
	for _, t := range due {
		ver := "1"
		if sc, ok := schemas.Lookup(t.Schema); ok {
			ver = strconv.Itoa(sc.Version)
		}
		rec := &kgo.Record{Topic: t.TargetTopic, Key: t.Key, Value: t.Payload, Headers: []kgo.RecordHeader{
			{Key: schemas.HeaderSchema, Value: []byte(t.Schema)},
			{Key: schemas.HeaderVersion, Value: []byte(ver)},
			{Key: HeaderTimerID, Value: []byte(t.TimerId)},
		}}
		out.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				produceErr.Store(err)
			}
		})
		out.Produce(ctx, &kgo.Record{Topic: s.cfg.Topic, Key: []byte(t.TimerId)}, func(_ *kgo.Record, err error) {
			if err != nil {
				produceErr.Store(err)
			}
		})
	}
	if err := out.Flush(ctx); err != nil {
		_ = out.EndTransaction(context.Background(), kgo.TryAbort)
		return err
	}
	if e := produceErr.Load(); e != nil {
		_ = out.AbortBufferedRecords(context.Background())
		_ = out.EndTransaction(context.Background(), kgo.TryAbort)
		return e.(error)
	}
	return out.EndTransaction(ctx, kgo.TryCommit)
}

// publishMetrics returns a function that copies the counters to gauges.
func (s *Service) publishMetrics() func() {
	pending := s.cfg.Metrics.NewGaugeVec("surge_timer_pending", "armed timers").With()
	fired := s.cfg.Metrics.NewCounterVec("surge_timer_fired_total", "timers fired by this instance").With()
	var published int64
	return func() {
		pending.Set(float64(s.pending.Load()))
		n := s.fired.Load()
		fired.Add(float64(n - published))
		published = n
	}
}
