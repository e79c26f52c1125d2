package allocation

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is the pool service's topology: the allocation API hands out uins
// from Redis; releases arrive on uin.pool.
var Spec = streams.Spec{
	Name: "uin-pool", Group: "uin-pool", Guarantee: streams.AtLeastOnce, // applied once by offset, in Redis
	Inputs: []string{schemas.TopicPool},
	Stores: []string{"redis: the central pool's buckets, leases and applied offsets"},
	Doc:    "allocation API (POST /v1/uins); applies releases from uin.pool once each",
}
