package restore

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the restore tool's topology (`surge uin restore`, run by an
// operator for a user who appeals).
var Spec = streams.Spec{
	Name:   "uin-restore",
	Reads:  []string{schemas.TopicBackups},
	Stores: []string{"redis: the account's core data and its uin claim"},
	Doc:    "gives a recycled account back to its owner from its backup",
}
