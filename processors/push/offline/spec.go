package offline

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the offline queues' topology: push.offline and push.login are
// co-partitioned, so each instance owns the queues of its partitions.
var Spec = streams.Spec{
	Name: "push-offline", Group: "push-offline", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicOffline, schemas.TopicLogin},
	Reads:   []string{schemas.TopicOffline, schemas.TopicReports, schemas.TopicPresence},
	Outputs: []string{schemas.TopicReports},
	Stores:  []string{"pebble: queued messages per offline user, with the applied offsets (rebuilt from push.offline and push.reports when behind)"},
	Doc:     "holds messages for offline users and delivers them at their next login",
}
