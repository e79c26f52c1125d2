package presence

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the presence processor's topology.
var Spec = streams.Spec{
	Name: "presence", Group: "presence", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicLogin},
	Reads:   []string{schemas.TopicPresence},
	Outputs: []string{schemas.TopicPresence},
	Stores:  []string{"memory: the online bitmap (roaring)", "redis: its mirror for other readers (optional)"},
	Doc:     "turns logins and logouts into online-state changes",
}
