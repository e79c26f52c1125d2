package recycle

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams/localstore"
)

// committed is the controller's committed state, shared by its stores.
//
// Keys in Pebble: 's' uin(4) -> the uin's last applied step (its last
// ticket); 'l' uin(4) -> newest login by auth(8) and by device(8), a merge
// of every login seen (loginMerger), so noting one reads nothing.
//
// Most uins a usage event or a grant names have no ticket: known, the set
// of uins with a state, answers that without a lookup. A ticket's untimed
// steps follow each other within seconds: recent holds the states
// committed last and writes a state to Pebble only when it leaves memory,
// so the steps a ticket takes while it is there never reach Pebble (the
// store is a cache rebuilt from the changelog on every start, so nothing
// needs to be on disk sooner).
type committed struct {
	db     *pebble.DB
	known  *roaring.Bitmap // uins with a state, in recent or Pebble
	recent *recentStates   // the states committed last
}

func newCommitted(db *pebble.DB, recentSize int) *committed {
	return &committed{db: db, known: roaring.New(), recent: newRecentStates(recentSize)}
}

// drop forgets the state and logins of the uins that match (their
// partitions were cleared), in memory and in Pebble alike.
func (c *committed) drop(match func(uin []byte) bool) error {
	var gone []uint32
	it := c.known.Iterator()
	for it.HasNext() {
		if u := it.Next(); match(schemas.UinKey(u)) {
			gone = append(gone, u)
		}
	}
	for _, u := range gone {
		c.known.Remove(u)
	}
	c.recent.forget(func(u uint32) bool { return match(schemas.UinKey(u)) })
	// Keys are a one-byte kind and a 4-byte uin.
	return localstore.DeleteWhere(c.db, func(k []byte) bool { return len(k) == 5 && match(k[1:]) })
}

// store is a view of the committed state with changes of its own: two
// maps hold what the batch in flight changed, made committed only when
// the batch commits (an aborted batch is simply forgotten).
type store struct {
	*committed
	steps  map[uint32]*pb.RecycleStep // nil: delete the uin's state
	logins map[uint32]LastLogin       // the batch's logins, merged into Pebble's at commit
	// retention > 0 drops finished tickets older than it (the rebuild's
	// store; see Policy.EndedRetention).
	retention time.Duration
	now       func() time.Time
}

func newStore(c *committed) *store {
	return &store{committed: c, steps: map[uint32]*pb.RecycleStep{}, logins: map[uint32]LastLogin{}}
}

// recentStates holds the states committed last, in two generations of up
// to size each: a lookup finds what was committed within the last size to
// 2*size states, and memory stays bounded. When the current generation is
// full, the previous one leaves memory, to be written to Pebble. Its
// states are shared: never modified.
type recentStates struct {
	size      int
	cur, prev map[uint32]*pb.RecycleStep
}

func newRecentStates(size int) *recentStates {
	return &recentStates{size: size, cur: map[uint32]*pb.RecycleStep{}}
}

func (r *recentStates) get(uin uint32) (*pb.RecycleStep, bool) {
	if st, ok := r.cur[uin]; ok {
		return st, true
	}
	st, ok := r.prev[uin]
	return st, ok
}

// put records uin's committed state (nil: it has none), and returns the
// states that leave memory to make room (nil: none), for Pebble.
func (r *recentStates) put(uin uint32, st *pb.RecycleStep) (evicted map[uint32]*pb.RecycleStep) {
	if len(r.cur) >= r.size {
		evicted, r.prev, r.cur = r.prev, r.cur, make(map[uint32]*pb.RecycleStep, r.size)
	}
	r.cur[uin] = st
	delete(r.prev, uin) // superseded: not worth writing when prev leaves
	return evicted
}

// forget drops the uins that match (their partitions were cleared).
func (r *recentStates) forget(match func(uin uint32) bool) {
	for _, m := range []map[uint32]*pb.RecycleStep{r.cur, r.prev} {
		maps.DeleteFunc(m, func(u uint32, _ *pb.RecycleStep) bool { return match(u) })
	}
}

// openDB opens the controller's Pebble (a cache, wiped on start).
func openDB(dir string, log *slog.Logger) (*pebble.DB, error) {
	return localstore.Open(dir, true, log, localstore.Merger(loginMerger))
}

func stateKey(uin uint32) []byte { return binary.BigEndian.AppendUint32([]byte{'s'}, uin) }
func loginKey(uin uint32) []byte { return binary.BigEndian.AppendUint32([]byte{'l'}, uin) }

// state returns the uin's last ticket at its last applied step, or nil.
func (s *store) state(uin uint32) (*pb.RecycleStep, error) {
	if st, ok := s.steps[uin]; ok {
		return st, nil
	}
	if !s.known.Contains(uin) {
		return nil, nil
	}
	if st, ok := s.recent.get(uin); ok {
		return st, nil
	}
	v, cl, err := s.db.Get(stateKey(uin))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	st := new(pb.RecycleStep)
	return st, proto.Unmarshal(v, st)
}

// setState records an applied step. An ended ticket (RELEASE, STOPPED)
// stays as the uin's state, so a late duplicate of one of its requests is
// recognised as such rather than taken for a step of an unknown ticket.
func (s *store) setState(st *pb.RecycleStep) {
	uin := uint32(st.Uin)
	if s.retention > 0 && st.Step != pb.RecycleStepKind_RECYCLE_STEP_UNSPECIFIED && ended(st) &&
		st.AtMs < s.now().Add(-s.retention).UnixMilli() {
		st = nil // finished long ago: forgotten
	}
	s.steps[uin] = st
}

// ended reports whether a state is a finished ticket (or none).
func ended(st *pb.RecycleStep) bool {
	return st == nil || st.Step == pb.RecycleStepKind_RELEASE || st.Step == pb.RecycleStepKind_STOPPED
}

// login is the uin's newest logins: Pebble's, and the batch's.
func (s *store) login(uin uint32) (LastLogin, error) {
	staged := s.logins[uin]
	v, cl, err := s.db.Get(loginKey(uin))
	if errors.Is(err, pebble.ErrNotFound) {
		return staged, nil
	}
	if err != nil {
		return LastLogin{}, err
	}
	defer cl.Close()
	l, err := decodeLogin(v)
	return l.newer(staged), err
}

// noteLogin keeps the newest login per source.
func (s *store) noteLogin(u *pb.UsageEvent) {
	if u.Kind != recycling.KindLogin {
		return
	}
	l := s.logins[uint32(u.Uin)]
	if u.Source == "device" {
		l.Device = max(l.Device, u.AtMs)
	} else {
		l.Auth = max(l.Auth, u.AtMs)
	}
	s.logins[uint32(u.Uin)] = l
}

// size is the number of staged changes.
func (s *store) size() int { return len(s.steps) + len(s.logins) }

// commit makes the staged changes the committed state: states into
// recent (and the ones it lets go into Pebble), logins merged into Pebble.
// A failed commit leaves the store unusable: the caller exits, and the
// restart rebuilds it.
func (s *store) commit() error {
	b := s.db.NewBatch()
	defer b.Close()
	for uin, st := range s.steps {
		if st == nil {
			s.known.Remove(uin)
		} else {
			s.known.Add(uin)
		}
		for u, old := range s.recent.put(uin, st) {
			if old == nil {
				_ = b.Delete(stateKey(u), nil)
				continue
			}
			v, _ := proto.Marshal(old)
			_ = b.Set(stateKey(u), v, nil)
		}
	}
	for uin, l := range s.logins {
		_ = b.Merge(loginKey(uin), l.encode(), nil)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	s.discard()
	return nil
}

// discard forgets the staged changes.
func (s *store) discard() {
	clear(s.steps)
	clear(s.logins)
}

func (l LastLogin) encode() []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(l.Auth)), uint64(l.Device))
}

func decodeLogin(v []byte) (LastLogin, error) {
	if len(v) != 16 {
		return LastLogin{}, fmt.Errorf("recycle: a login entry of %d bytes, want 16", len(v))
	}
	return LastLogin{int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))}, nil
}

// newer is the newest of both, per source.
func (l LastLogin) newer(o LastLogin) LastLogin {
	return LastLogin{Auth: max(l.Auth, o.Auth), Device: max(l.Device, o.Device)}
}

// loginMerger merges login entries into the newest per source: the order
// of the operands does not matter.
var loginMerger = &pebble.Merger{
	Name: "surge.recycle.last-login.v1",
	Merge: func(_, value []byte) (pebble.ValueMerger, error) {
		m := &loginMerge{}
		return m, m.MergeNewer(value)
	},
}

type loginMerge struct{ l LastLogin }

func (m *loginMerge) MergeNewer(v []byte) error {
	l, err := decodeLogin(v)
	m.l = m.l.newer(l)
	return err
}

func (m *loginMerge) MergeOlder(v []byte) error { return m.MergeNewer(v) }

func (m *loginMerge) Finish(bool) ([]byte, io.Closer, error) { return m.l.encode(), nil, nil }
