package tracker

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the registration tracker's topology: its inputs are
// co-partitioned by uin, its state is the compacted uin.tracking.
var Spec = streams.Spec{
	Name: "uin-tracker", Group: "uin-tracker", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicRegistrations, schemas.TopicUsage, schemas.TopicChecks, schemas.TopicRecycleSteps},
	Reads:   []string{schemas.TopicTracking},
	Outputs: []string{schemas.TopicTracking, schemas.TopicTimers, schemas.TopicRecycleReqs},
	Stores:  []string{"pebble: tracking state per uin (from uin.tracking)"},
	Doc:     "follows each registration and the account's use; requests a recycle ticket for an abandoned one",
}
