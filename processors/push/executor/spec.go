package executor

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is an executor's topology. Each executor is its own group
// (push-executor-<name>) over its own unit queue, push.units.<name>.
var Spec = streams.Spec{
	Name: "push-executor", Group: "push-executor-<name>", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicUnits + ".*"},
	Reads:   []string{schemas.TopicPresence, schemas.TopicExecCommands},
	Outputs: []string{schemas.TopicReports, schemas.TopicExecutors, schemas.TopicOffline},
	Stores:  []string{"memory: the online bitmap (from push.presence, checkpointed to a local file)"},
	Doc:     "delivers units to online users, queues the offline ones, reports its load",
}
