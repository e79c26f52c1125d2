package timer

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is one system's timer service: it reads the whole timers topic,
// fires its own timers (Targets) into targets and tombstones them.
func Spec(name string, targets ...string) streams.Spec {
	return streams.Spec{
		Name:    name,
		Reads:   []string{schemas.TopicTimers},
		Outputs: append([]string{schemas.TopicTimers}, targets...),
		Stores:  []string{"pebble: pending timers by due time (from platform.timers)"},
		Doc:     "fires due timers into their target topics, once each",
	}
}
