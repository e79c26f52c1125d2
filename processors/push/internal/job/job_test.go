package job

import (
	"errors"
	"testing"

	pb "surge/schemas/surgev1"
)

func TestTableCoversEveryState(t *testing.T) {
	for v := range pb.JobState_name {
		s := pb.JobState(v)
		if _, ok := Transitions[s]; !ok {
			t.Errorf("state %s missing from the table", s)
		}
	}
	for from, tos := range Transitions {
		for _, to := range tos {
			if _, ok := Transitions[to]; !ok {
				t.Errorf("%s -> %s leads to a state outside the table", from, to)
			}
		}
	}
	// Every non-terminal state can reach a terminal one.
	for s := range Transitions {
		if !reachesTerminal(s, map[pb.JobState]bool{}) {
			t.Errorf("state %s can never end", s)
		}
	}
}

func reachesTerminal(s pb.JobState, seen map[pb.JobState]bool) bool {
	if Terminal(s) {
		return true
	}
	if seen[s] {
		return false
	}
	seen[s] = true
	for _, n := range Transitions[s] {
		if reachesTerminal(n, seen) {
			return true
		}
	}
	return false
}

func TestMachineRefusesIllegal(t *testing.T) {
	m := NewMachine()
	path := []pb.JobState{pb.JobState_CREATED, pb.JobState_VALIDATING, pb.JobState_FETCHING_TARGETS,
		pb.JobState_PACKAGE_READY, pb.JobState_FILTERING, pb.JobState_QUEUED, pb.JobState_DISPATCHING,
		pb.JobState_SENDING, pb.JobState_PREEMPTED, pb.JobState_RESUMING, pb.JobState_DISPATCHING,
		pb.JobState_SENDING, pb.JobState_COMPLETED}
	for _, s := range path {
		if _, err := m.Move("j", s); err != nil {
			t.Fatal(err)
		}
	}
	var ill *IllegalError
	for _, bad := range []pb.JobState{pb.JobState_SENDING, pb.JobState_CREATED, pb.JobState_CANCELLED} {
		if _, err := m.Move("j", bad); !errors.As(err, &ill) {
			t.Fatalf("completed job moved to %s: %v", bad, err)
		}
	}
	if _, err := m.Move("k", pb.JobState_SENDING); err == nil {
		t.Fatal("unknown job jumped to SENDING")
	}
	if err := m.Observe(&pb.JobTransition{JobId: "k", From: pb.JobState_QUEUED, To: pb.JobState_DISPATCHING}); err == nil {
		t.Fatal("observed a transition not starting at the job's state")
	}
	if m.State("j") != pb.JobState_COMPLETED || m.Count()[pb.JobState_COMPLETED] != 1 {
		t.Fatalf("state %s", m.State("j"))
	}
}
