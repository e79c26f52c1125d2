package planner

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the planner's topology: it consumes jobs, executor loads and the
// directory's topics in one group, and writes every step as a transition
// in the same transaction as the units it dispatches.
var Spec = streams.Spec{
	Name: "push-planner", Group: "push-planner", Guarantee: streams.ExactlyOnce,
	Inputs: []string{schemas.TopicJobs, schemas.TopicJobCommands, schemas.TopicExecutors,
		schemas.TopicAccounts, schemas.TopicFanDelta, schemas.TopicTags, schemas.TopicBlacklists, schemas.TopicJobClicks},
	Reads: []string{schemas.TopicPlannerCkpt, schemas.TopicJobTransitions, schemas.TopicPackages, schemas.TopicExecutors,
		schemas.TopicAccounts, schemas.TopicFanDelta, schemas.TopicTags, schemas.TopicBlacklists, schemas.TopicJobClicks},
	// push.executors: revocations of a silent executor's units, written
	// under that executor's transactional id (reassign.go).
	Outputs: []string{schemas.TopicJobTransitions, schemas.TopicPlannerCkpt, schemas.TopicUnits + ".*", schemas.TopicPackages, schemas.TopicReports, schemas.TopicTimers, schemas.TopicExecutors},
	Stores: []string{"memory: job states, queue, CRC and quota bitmaps (checkpoint on push.planner-checkpoints, then push.job-transitions after it)",
		"pebble: number packages (from push.packages, kept across restarts with its position)", "memory: the directory (accounts, follower lists, tags, blacklists)"},
	Doc: "validates, filters, queues and dispatches send jobs in units to executors",
}
