package recycle

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

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
	s := newStore(db)
	s.retention, s.now = 30*24*time.Hour, func() time.Time { return now }
	old, recent := now.Add(-31*24*time.Hour).UnixMilli(), now.Add(-29*24*time.Hour).UnixMilli()
	for _, st := range []*pb.RecycleStep{
		{Uin: 1, Step: pb.RecycleStepKind_BAN, AtMs: old},            // the same uin's ticket went on...
		{Uin: 1, Step: pb.RecycleStepKind_RELEASE, AtMs: old},        // ...and ended long ago: dropped
		{Uin: 2, Step: pb.RecycleStepKind_STOPPED, AtMs: old},        // dropped
		{Uin: 3, Step: pb.RecycleStepKind_RELEASE, AtMs: recent},     // kept
		{Uin: 4, Step: pb.RecycleStepKind_COOL_DOWN, AtMs: old},      // in flight: kept
		{Uin: 5, Step: pb.RecycleStepKind_TICKET_GRANTED, AtMs: old}, // in flight: kept
	} {
		s.setState(st)
	}
	if err := s.commit(); err != nil {
		t.Fatal(err)
	}
	live := newStore(db)
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
