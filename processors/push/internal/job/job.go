// Package job is the send job's state machine: every state and every legal
// transition is written down once, here. Each transition is published on
// push.job-transitions; a Machine refuses a transition the table does not
// hold, so a bug or a replayed stale event can never move a job backwards.
package job

import (
	"fmt"
	"maps"
	"sync"

	pb "surge/schemas/surgev1"
)

// Transitions is the whole state machine: from -> allowed next states.
var Transitions = map[pb.JobState][]pb.JobState{
	pb.JobState_JOB_STATE_UNSPECIFIED: {pb.JobState_CREATED},
	pb.JobState_CREATED:               {pb.JobState_VALIDATING},
	pb.JobState_VALIDATING:            {pb.JobState_REJECTED, pb.JobState_FETCHING_TARGETS},
	pb.JobState_FETCHING_TARGETS:      {pb.JobState_PACKAGE_READY, pb.JobState_FAILED},
	pb.JobState_PACKAGE_READY:         {pb.JobState_WAITING_SCHEDULE, pb.JobState_FILTERING},
	pb.JobState_WAITING_SCHEDULE:      {pb.JobState_FILTERING, pb.JobState_CANCELLED, pb.JobState_EXPIRED},
	pb.JobState_FILTERING:             {pb.JobState_QUEUED, pb.JobState_WAITING_QUOTA, pb.JobState_COMPLETED, pb.JobState_FAILED},
	pb.JobState_WAITING_QUOTA:         {pb.JobState_FILTERING, pb.JobState_EXPIRED, pb.JobState_CANCELLED},
	pb.JobState_QUEUED:                {pb.JobState_DISPATCHING, pb.JobState_PAUSED, pb.JobState_CANCELLED, pb.JobState_EXPIRED},
	pb.JobState_DISPATCHING:           {pb.JobState_SENDING, pb.JobState_FAILED},
	pb.JobState_SENDING: {pb.JobState_DISPATCHING, pb.JobState_PREEMPTED, pb.JobState_PAUSED, pb.JobState_DRAINING,
		pb.JobState_COMPLETED, pb.JobState_PARTIALLY_COMPLETED, pb.JobState_FAILED, pb.JobState_CANCELLED},
	pb.JobState_PREEMPTED: {pb.JobState_RESUMING, pb.JobState_PAUSED, pb.JobState_CANCELLED, pb.JobState_EXPIRED},
	pb.JobState_PAUSED:    {pb.JobState_RESUMING, pb.JobState_CANCELLED},
	pb.JobState_DRAINING:  {pb.JobState_RESUMING, pb.JobState_COMPLETED, pb.JobState_PAUSED, pb.JobState_CANCELLED},
	pb.JobState_RESUMING:  {pb.JobState_DISPATCHING, pb.JobState_SENDING},
	// Terminal states have no way out.
	pb.JobState_REJECTED:            nil,
	pb.JobState_COMPLETED:           nil,
	pb.JobState_PARTIALLY_COMPLETED: nil,
	pb.JobState_FAILED:              nil,
	pb.JobState_CANCELLED:           nil,
	pb.JobState_EXPIRED:             nil,
}

// Allowed reports whether from -> to is a transition of the machine.
func Allowed(from, to pb.JobState) bool {
	for _, s := range Transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Terminal reports whether s ends a job.
func Terminal(s pb.JobState) bool {
	next, ok := Transitions[s]
	return ok && len(next) == 0
}

// IllegalError is a refused transition.
type IllegalError struct {
	JobID    string
	From, To pb.JobState
}

func (e *IllegalError) Error() string {
	return fmt.Sprintf("job %s: illegal transition %s -> %s", e.JobID, e.From, e.To)
}

// Machine tracks the current state of many jobs.
type Machine struct {
	mu     sync.RWMutex
	states map[string]pb.JobState
}

// NewMachine returns an empty machine.
func NewMachine() *Machine { return &Machine{states: map[string]pb.JobState{}} }

// State is the job's current state (UNSPECIFIED if unknown).
func (m *Machine) State(id string) pb.JobState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.states[id]
}

// Known reports whether the machine has seen the job.
func (m *Machine) Known(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.states[id]
	return ok
}

// Move applies from -> to, refusing it when the job is not in from or the
// table lacks the edge.
func (m *Machine) Move(id string, to pb.JobState) (pb.JobTransition, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	from := m.states[id]
	if !Allowed(from, to) {
		return pb.JobTransition{}, &IllegalError{JobID: id, From: from, To: to}
	}
	m.states[id] = to
	return pb.JobTransition{JobId: id, From: from, To: to}, nil
}

// Observe applies a transition read back from the topic (restore). A
// transition that does not start where the job is was never written by a
// correct planner and is refused.
func (m *Machine) Observe(t *pb.JobTransition) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.states[t.JobId]; cur != t.From || !Allowed(t.From, t.To) {
		return &IllegalError{JobID: t.JobId, From: cur, To: t.To}
	}
	m.states[t.JobId] = t.To
	return nil
}

// States returns a copy of every job's state (a checkpoint).
func (m *Machine) States() map[string]pb.JobState {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return maps.Clone(m.states)
}

// Load replaces every job's state with a checkpoint's.
func (m *Machine) Load(states map[string]pb.JobState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.states = maps.Clone(states)
	if m.states == nil {
		m.states = map[string]pb.JobState{}
	}
}

// Count returns how many jobs are in each state.
func (m *Machine) Count() map[pb.JobState]int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := map[pb.JobState]int{}
	for _, s := range m.states {
		out[s]++
	}
	return out
}
