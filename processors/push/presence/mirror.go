package presence

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/redis/go-redis/v9"

	"surge/streams/connect"
	"surge/streams/metrics"
)

// The online bitmap is shared with other instances (the senders) through
// Redis, the seed's "4.2 billion bits in shared memory". The 32-bit space is
// cut into shard keys of 2^16 bits (8 KiB each): no key is hot or huge, a
// Redis cluster spreads them over its slots, and a rewrite of one shard is
// cheap. shard = uin >> 16, bit = uin & 0xFFFF.
const shardBits = 16

// RedisMirror writes committed presence changes to Redis bitmaps from its
// own goroutine. Redis is a weak dependency: processing only hands changes
// over (coalesced per uin); a failed write marks the mirror dirty and the
// goroutine rewrites every shard from the committed bitmap once Redis
// answers again.
type RedisMirror struct {
	rdb         redis.UniversalClient
	prefix      string
	timeout     time.Duration
	resyncEvery time.Duration
	log         *slog.Logger
	errs        metrics.Counter
	resyncs     metrics.Counter

	mu       sync.Mutex
	pending  map[uint32]bool
	dirty    bool // Redis may hold anything: the next write is a full resync
	inFlight bool
	kick     chan struct{}
}

// NewRedisMirror mirrors into keys "<prefix><shard>"; use a shadow prefix
// for load-test traffic.
func NewRedisMirror(rdb redis.UniversalClient, prefix string, reg *metrics.Registry, log *slog.Logger) *RedisMirror {
	if reg == nil {
		reg = metrics.Default
	}
	if log == nil {
		log = slog.Default()
	}
	return &RedisMirror{
		rdb: rdb, prefix: prefix, timeout: 5 * time.Second, resyncEvery: 2 * time.Second, log: log,
		errs:    reg.NewCounterVec("surge_presence_mirror_errors_total", "failed writes of the online bitmap to Redis").With(),
		resyncs: reg.NewCounterVec("surge_presence_mirror_resyncs_total", "full rewrites of the online bitmap to Redis").With(),
		pending: map[uint32]bool{},
		dirty:   true,
		kick:    make(chan struct{}, 1),
	}
}

// start runs the writer until ctx ends; committed returns a snapshot of the
// committed bitmap for resyncs.
func (m *RedisMirror) start(ctx context.Context, committed func() *roaring.Bitmap) {
	go func() {
		tick := time.NewTicker(m.resyncEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.kick:
			case <-tick.C:
			}
			m.writeOnce(committed)
		}
	}()
	m.signal()
}

func (m *RedisMirror) signal() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// enqueue hands over changes that are already in the committed bitmap.
func (m *RedisMirror) enqueue(changes map[uint32]bool) {
	if len(changes) == 0 {
		return
	}
	m.mu.Lock()
	for uin, on := range changes {
		m.pending[uin] = on
	}
	m.mu.Unlock()
	m.signal()
}

func (m *RedisMirror) writeOnce(committed func() *roaring.Bitmap) {
	m.mu.Lock()
	batch, dirty := m.pending, m.dirty
	if len(batch) == 0 && !dirty {
		m.mu.Unlock()
		return
	}
	m.pending, m.inFlight = map[uint32]bool{}, true
	m.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), m.timeout)
	defer cancel()
	var err error
	if dirty {
		// The snapshot is taken after pending was emptied, so it holds
		// every change handed over so far.
		err = m.Resync(ctx, committed())
	} else {
		err = m.Apply(ctx, batch)
	}
	m.mu.Lock()
	m.inFlight = false
	if err != nil {
		m.dirty = true
		m.errs.Inc()
	} else if dirty {
		m.dirty = false
		m.resyncs.Inc()
	}
	m.mu.Unlock()
	if err != nil {
		m.log.Warn("presence: redis write failed; will resync", "err", err, "retry_in", m.resyncEvery)
	}
}

// WaitSynced blocks until Redis holds every committed change.
func (m *RedisMirror) WaitSynced(ctx context.Context) error {
	for {
		m.mu.Lock()
		done := len(m.pending) == 0 && !m.dirty && !m.inFlight
		m.mu.Unlock()
		if done {
			return nil
		}
		m.signal()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Dirty reports whether Redis may be behind the committed state.
func (m *RedisMirror) Dirty() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dirty
}

func (m *RedisMirror) key(shard uint32) string { return m.prefix + strconv.Itoa(int(shard)) }

// generationKey marks a Redis that holds the whole mirror: a full
// rewrite sets it, and a Redis that lost its data lost it too. It lies
// outside the shards' pattern (prefix*), which Count and Resync scan.
func (m *RedisMirror) generationKey() string { return "generation:" + m.prefix }

// errMirrorLost is a Redis that no longer holds the mirror's generation
// marker: it restarted empty (or was flushed) between two writes, which
// then succeeded on a new connection. A full rewrite mends it.
var errMirrorLost = errors.New("presence: redis lost the mirror (no generation marker); rewriting it from the committed bitmap")

// Apply sets the bits of changed users in one pipeline, and checks in the
// same round trip that Redis still holds the mirror.
func (m *RedisMirror) Apply(ctx context.Context, changes map[uint32]bool) error {
	pipe := m.rdb.Pipeline()
	for uin, on := range changes {
		v := 0
		if on {
			v = 1
		}
		pipe.SetBit(ctx, m.key(uin>>shardBits), int64(uin&(1<<shardBits-1)), v)
	}
	held := pipe.Exists(ctx, m.generationKey())
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if held.Val() == 0 {
		return errMirrorLost
	}
	return nil
}

// Resync rewrites Redis from online: every non-empty shard is SET whole,
// every other shard key under the prefix is deleted.
func (m *RedisMirror) Resync(ctx context.Context, online *roaring.Bitmap) error {
	shards := map[uint32][]byte{}
	it := online.Iterator()
	for it.HasNext() {
		uin := it.Next()
		s, off := uin>>shardBits, uin&(1<<shardBits-1)
		buf := shards[s]
		if buf == nil {
			buf = make([]byte, 1<<shardBits/8)
			shards[s] = buf
		}
		buf[off>>3] |= 0x80 >> (off & 7) // Redis bit 0 is the high bit of byte 0
	}
	existing, err := m.keys(ctx)
	if err != nil {
		return err
	}
	pipe := m.rdb.Pipeline()
	for _, k := range existing {
		if s, err := strconv.Atoi(strings.TrimPrefix(k, m.prefix)); err == nil {
			if _, keep := shards[uint32(s)]; !keep {
				pipe.Del(ctx, k)
			}
		}
	}
	for s, buf := range shards {
		pipe.Set(ctx, m.key(s), buf, 0)
	}
	pipe.Set(ctx, m.generationKey(), strconv.FormatInt(time.Now().UnixNano(), 36), 0)
	_, err = pipe.Exec(ctx)
	return err
}

func (m *RedisMirror) keys(ctx context.Context) ([]string, error) {
	return connect.Scan(ctx, m.rdb, m.prefix+"*")
}

// IsOnline reads one user's state from Redis: what another instance sees.
func (m *RedisMirror) IsOnline(ctx context.Context, uin uint32) (bool, error) {
	v, err := m.rdb.GetBit(ctx, m.key(uin>>shardBits), int64(uin&(1<<shardBits-1))).Result()
	return v == 1, err
}

// Count is the number of online users in Redis.
func (m *RedisMirror) Count(ctx context.Context) (int64, error) {
	keys, err := m.keys(ctx)
	if err != nil {
		return 0, err
	}
	pipe := m.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.BitCount(ctx, k, nil)
	}
	if len(keys) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, err
		}
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}
