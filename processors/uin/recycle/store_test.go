package recycle

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
)

// A rebuild keeps finished tickets younger than the retention (so a late
// duplicate of their requests is still recognised) and every ticket in
// flight however old, and forgets finished ones past it.
func TestRebuildDropsEndedTicketsPastRetention(t *testing.T) {
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	// Two states in memory at most: the others are in Pebble.
	com := newCommitted(db, 1)
	s := newStore(com)
	s.retention, s.now = 30*24*time.Hour, func() time.Time { return now }
	old, young := now.Add(-31*24*time.Hour).UnixMilli(), now.Add(-29*24*time.Hour).UnixMilli()
	for _, st := range []*pb.RecycleStep{
		{Uin: 1, Step: pb.RecycleStepKind_BAN, AtMs: old},            // the same uin's ticket went on...
		{Uin: 1, Step: pb.RecycleStepKind_RELEASE, AtMs: old},        // ...and ended long ago: dropped
		{Uin: 2, Step: pb.RecycleStepKind_STOPPED, AtMs: old},        // dropped
		{Uin: 3, Step: pb.RecycleStepKind_RELEASE, AtMs: young},      // kept
		{Uin: 4, Step: pb.RecycleStepKind_COOL_DOWN, AtMs: old},      // in flight: kept
		{Uin: 5, Step: pb.RecycleStepKind_TICKET_GRANTED, AtMs: old}, // in flight: kept
	} {
		s.setState(st)
	}
	if err := s.commit(); err != nil {
		t.Fatal(err)
	}
	live := newStore(com)
	for uin, want := range map[uint32]pb.RecycleStepKind{1: 0, 2: 0, 3: pb.RecycleStepKind_RELEASE,
		4: pb.RecycleStepKind_COOL_DOWN, 5: pb.RecycleStepKind_TICKET_GRANTED} {
		st, err := live.state(uin)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.GetStep(); got != want {
			t.Errorf("uin %d: state %v, want %v", uin, got, want)
		}
	}
}

// The login index is a merge: noting a login reads nothing, and a read
// gives the newest login per source however the logins were spread over
// batches, flushes and compactions, in any order.
func TestLoginIndexKeepsTheNewestPerSource(t *testing.T) {
	db, err := openDB(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := newStore(newCommitted(db, 1))
	note := func(source string, at int64) {
		s.noteLogin(&pb.UsageEvent{Uin: 7, Kind: recycling.KindLogin, Source: source, AtMs: at})
	}
	check := func(when string, want LastLogin) {
		t.Helper()
		got, err := s.login(7)
		if err != nil || got != want {
			t.Errorf("%s: login %+v, %v; want %+v", when, got, err, want)
		}
	}
	note("auth", 500)
	note("device", 300)
	check("staged", LastLogin{Auth: 500, Device: 300})
	if err := s.commit(); err != nil {
		t.Fatal(err)
	}
	check("committed", LastLogin{Auth: 500, Device: 300})
	if err := db.Flush(); err != nil { // into an sstable: the merges meet there
		t.Fatal(err)
	}
	note("auth", 400) // older than what Pebble has: kept out
	note("device", 900)
	s.noteLogin(&pb.UsageEvent{Uin: 7, Kind: recycling.KindLoginRefused, Source: "auth", AtMs: 2000}) // not a login
	check("staged over committed", LastLogin{Auth: 500, Device: 900})
	if err := s.commit(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(context.Background(), []byte{'l'}, []byte{'m'}, true); err != nil {
		t.Fatal(err)
	}
	check("compacted", LastLogin{Auth: 500, Device: 900})
	if got, err := s.login(8); err != nil || got != (LastLogin{}) {
		t.Errorf("a uin never seen: %+v, %v", got, err)
	}
}

// States live in memory until they leave it for Pebble: whatever the
// order of writes, evictions and forgotten tickets, a read gives the last
// committed state, and what left memory is in Pebble.
func TestStatesLeaveMemoryForPebbleAndReadBack(t *testing.T) {
	db, err := openDB(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 1))
	s := newStore(newCommitted(db, 3))
	model := map[uint32]pb.RecycleStepKind{}
	for commit := range 500 {
		for range 1 + rng.IntN(4) {
			uin := uint32(1 + rng.IntN(30))
			if rng.IntN(8) == 0 {
				s.steps[uin] = nil // forgotten (past retention)
				delete(model, uin)
				continue
			}
			k := pb.RecycleStepKind(1 + rng.IntN(7))
			s.setState(&pb.RecycleStep{Uin: uint64(uin), Step: k, AtMs: int64(commit)})
			model[uin] = k
		}
		if err := s.commit(); err != nil {
			t.Fatal(err)
		}
		for uin := uint32(1); uin <= 30; uin++ {
			st, err := s.state(uin)
			if err != nil || st.GetStep() != model[uin] {
				t.Fatalf("seed %d, commit %d: uin %d reads %v (%v), want %v", seed, commit, uin, st.GetStep(), err, model[uin])
			}
		}
	}
	onDisk := 0
	for uin := range model {
		if _, ok := s.recent.get(uin); ok {
			continue
		}
		v, cl, err := db.Get(stateKey(uin))
		if err != nil {
			t.Fatalf("seed %d: uin %d is neither in memory nor in Pebble: %v", seed, uin, err)
		}
		var st pb.RecycleStep
		if err := proto.Unmarshal(v, &st); err != nil || st.Step != model[uin] {
			t.Fatalf("seed %d: uin %d in Pebble at %v, want %v", seed, uin, st.Step, model[uin])
		}
		cl.Close()
		onDisk++
	}
	if onDisk == 0 {
		t.Fatalf("seed %d: no state left memory: the test tests nothing", seed)
	}
}

// Dropping cleared partitions' uins forgets their states wherever they
// are (memory or Pebble) and their logins, and keeps every other uin's.
func TestDropForgetsTheMatchingUinsEverywhere(t *testing.T) {
	db, err := openDB(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	com := newCommitted(db, 4) // of 20 states, most leave memory for Pebble
	s := newStore(com)
	for uin := uint64(1); uin <= 20; uin++ {
		s.setState(&pb.RecycleStep{Uin: uin, Step: pb.RecycleStepKind_BAN})
		s.noteLogin(&pb.UsageEvent{Uin: uin, Kind: recycling.KindLogin, Source: "auth", AtMs: int64(uin)})
		if err := s.commit(); err != nil {
			t.Fatal(err)
		}
	}
	odd := func(uin []byte) bool { return binary.BigEndian.Uint32(uin)%2 == 1 }
	if err := com.drop(odd); err != nil {
		t.Fatal(err)
	}
	// More states push the ones in memory out to Pebble: none of the
	// dropped may come back with them.
	for uin := uint64(21); uin <= 40; uin++ {
		s.setState(&pb.RecycleStep{Uin: uin, Step: pb.RecycleStepKind_BAN})
		if err := s.commit(); err != nil {
			t.Fatal(err)
		}
	}
	for uin := uint32(1); uin <= 20; uin += 2 {
		if _, cl, err := db.Get(stateKey(uin)); err == nil {
			cl.Close()
			t.Errorf("dropped uin %d is back in Pebble", uin)
		}
	}
	for uin := uint32(1); uin <= 20; uin++ {
		st, err := s.state(uin)
		l, lerr := s.login(uin)
		if err != nil || lerr != nil {
			t.Fatal(err, lerr)
		}
		if gone := uin%2 == 1; (st == nil) != gone || (l == LastLogin{}) != gone {
			t.Errorf("uin %d: state %v, login %+v after dropping the odd uins", uin, st.GetStep(), l)
		}
	}
}
