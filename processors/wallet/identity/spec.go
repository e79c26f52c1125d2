package identity

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is wallet-identities' topology: the account system's app accounts
// in, each one's actID in Redis out.
var Spec = streams.Spec{
	Name: "wallet-identities", Group: "wallet-identities", Guarantee: streams.AtLeastOnce,
	Inputs: []string{schemas.TopicIdentities},
	Stores: []string{"redis: each app account's actID and the offset of its record (wid2:<app>:<user>), and the marker that the cache is whole (wid:gen); rebuilt from the topic when the marker is gone"},
	Doc:    "derives each app account's actID, phone number first, for the API to answer",
}
