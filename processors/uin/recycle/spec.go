package recycle

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the recycle controller's topology: requested steps are applied
// by compare-and-set against the tickets rebuilt from uin.recycle-steps.
var Spec = streams.Spec{
	Name: "uin-recycle", Group: "uin-recycle", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicRecycleReqs, schemas.TopicUsage},
	Reads:   []string{schemas.TopicRecycleSteps, schemas.TopicUsage},
	Outputs: []string{schemas.TopicRecycleSteps, schemas.TopicRecycleReqs, schemas.TopicTimers, schemas.TopicBackups, schemas.TopicDeletions, schemas.TopicPool},
	Stores:  []string{"pebble: recycle tickets and last use per uin (from uin.recycle-steps and uin.usage)", "redis: accounts' core data (backed up, then deleted)"},
	Doc:     "moves each recycle ticket through its steps and puts the uin back into the pool",
}
