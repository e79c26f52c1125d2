package restore

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the restore service's topology (`surge run uin-restore`; an
// operator asks with `surge uin restore`, the appeal flow by publishing).
var Spec = streams.Spec{
	Name: "uin-restore", Group: "uin-restore", Guarantee: streams.ExactlyOnce,
	Inputs:  []string{schemas.TopicRestoreReqs},
	Reads:   []string{schemas.TopicBackups},
	Outputs: []string{schemas.TopicRestoreResults, schemas.TopicRegistrations},
	Stores:  []string{"redis: the account's core data, its uin claim and each request's decision"},
	Doc:     "gives a recycled account back to its owner from its backup, on request",
}
