package recycle

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"google.golang.org/protobuf/proto"

	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
)

// store is the controller's state: Pebble holds what is committed, and two
// maps hold what the batch in flight changed, written to Pebble only when
// the batch commits (an aborted batch is simply forgotten).
//
// Keys: 's' uin(4) -> the uin's last applied step (its last ticket);
// 'l' uin(4) -> newest login by auth(8) and by device(8).
type store struct {
	db     *pebble.DB
	steps  map[uint32]*pb.RecycleStep // nil: delete the uin's state
	logins map[uint32]LastLogin
	// retention > 0 drops finished tickets older than it (the rebuild's
	// store; see Policy.EndedRetention).
	retention time.Duration
	now       func() time.Time
}

func newStore(db *pebble.DB) *store {
	return &store{db: db, steps: map[uint32]*pb.RecycleStep{}, logins: map[uint32]LastLogin{}}
}

func stateKey(uin uint32) []byte { return binary.BigEndian.AppendUint32([]byte{'s'}, uin) }
func loginKey(uin uint32) []byte { return binary.BigEndian.AppendUint32([]byte{'l'}, uin) }

// state returns the uin's last ticket at its last applied step, or nil.
func (s *store) state(uin uint32) (*pb.RecycleStep, error) {
	if st, ok := s.steps[uin]; ok {
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

func (s *store) login(uin uint32) (LastLogin, error) {
	if l, ok := s.logins[uin]; ok {
		return l, nil
	}
	v, cl, err := s.db.Get(loginKey(uin))
	if errors.Is(err, pebble.ErrNotFound) {
		return LastLogin{}, nil
	}
	if err != nil {
		return LastLogin{}, err
	}
	defer cl.Close()
	return LastLogin{int64(binary.BigEndian.Uint64(v)), int64(binary.BigEndian.Uint64(v[8:]))}, nil
}

// noteLogin keeps the newest login per source.
func (s *store) noteLogin(u *pb.UsageEvent) error {
	if u.Kind != recycling.KindLogin {
		return nil
	}
	l, err := s.login(uint32(u.Uin))
	if err != nil {
		return err
	}
	if u.Source == "device" {
		l.Device = max(l.Device, u.AtMs)
	} else {
		l.Auth = max(l.Auth, u.AtMs)
	}
	s.logins[uint32(u.Uin)] = l
	return nil
}

// size is the number of staged changes.
func (s *store) size() int { return len(s.steps) + len(s.logins) }

// commit writes the staged changes to Pebble.
func (s *store) commit() error {
	b := s.db.NewBatch()
	defer b.Close()
	for uin, st := range s.steps {
		if st == nil {
			_ = b.Delete(stateKey(uin), nil)
			continue
		}
		v, _ := proto.Marshal(st)
		_ = b.Set(stateKey(uin), v, nil)
	}
	for uin, l := range s.logins {
		_ = b.Set(loginKey(uin), binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, uint64(l.Auth)), uint64(l.Device)), nil)
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
