// Package uinkeys names the uin system's Redis keyspace. Every key of the
// account store, the central pool and the restores' intents begins with
// Prefix(namespace), which is a Redis Cluster hash tag: the scripts that
// check one of them against another (a release refused while an account
// holds the uin, a restore's intent recorded with its claim) then touch
// keys of one slot, and run atomically in a cluster as on one server.
// The price is that one namespace's uin state lives on one cluster node.
package uinkeys

// Prefix is the hash-tagged prefix of namespace ns's uin keys
// ("{uin}acct:7", "{shadow.uin}pool:used"). The tag is never empty: Redis
// hashes a key whose braces hold nothing as a whole.
func Prefix(ns string) string { return "{" + ns + "uin}" }

// Pool is the prefix of the central pool's keys.
func Pool(ns string) string { return Prefix(ns) + "pool:" }
