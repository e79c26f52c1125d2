package ctr

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the click-through counter's topology.
var Spec = streams.Spec{
	Name: "push-ctr", Group: "push-ctr", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicClicks, schemas.TopicJobTransitions},
	Reads:   []string{schemas.TopicJobClicks},
	Outputs: []string{schemas.TopicJobClicks},
	Stores:  []string{"memory: click counts per job (from push.job-clicks)"},
	Doc:     "counts clicks per job, for the accounts' click-through quota",
}
