// Package topology is the product's topology in one place: every
// processor's declared spec, every sink's, and the other teams' services
// that publish to or read from its topics. `surge topics --graph` draws
// it; its test fails when a registry topic has no producer or no consumer.
package topology

import (
	"surge/processors/push/ctr"
	"surge/processors/push/executor"
	"surge/processors/push/offline"
	"surge/processors/push/planner"
	"surge/processors/push/presence"
	"surge/processors/timer"
	"surge/processors/uin/allocation"
	"surge/processors/uin/recycle"
	"surge/processors/uin/restore"
	"surge/processors/uin/tracker"
	"surge/processors/wallet/api"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/ledger"
	"surge/schemas"
	"surge/sinks/clickhouse"
	"surge/sinks/recon"
	"surge/streams"
)

// Processors are surge's own components, with their specs.
func Processors() []streams.Spec {
	specs := []streams.Spec{
		presence.Spec,
		planner.Spec, executor.Spec, offline.Spec, ctr.Spec,
		timer.Spec("push-timers", schemas.TopicJobs),
		tracker.Spec, recycle.Spec, allocation.Spec,
		timer.Spec("uin-timers", schemas.TopicChecks, schemas.TopicRecycleReqs),
		restore.Spec,
		ledger.Spec, api.Spec, identity.Spec,
		recon.Spec,
	}
	for _, s := range clickhouse.Facts() {
		specs = append(specs, s.Spec())
	}
	return specs
}

// Platform are the other teams' services: what they publish and read is
// the product's contract with them.
var Platform = []streams.Spec{
	{Name: "access layer", External: true, Outputs: []string{schemas.TopicLogin}, Doc: "logins and logouts"},
	{Name: "social graph", External: true, Outputs: []string{schemas.TopicFanDelta}, Doc: "follows and unfollows"},
	{Name: "account registry", External: true, Outputs: []string{schemas.TopicAccounts}, Doc: "public accounts: type, filters, followers, daily jobs"},
	{Name: "targeting", External: true, Outputs: []string{schemas.TopicTags}, Doc: "users' tags"},
	{Name: "moderation", External: true, Outputs: []string{schemas.TopicBlacklists}, Doc: "per-account and global blacklists"},
	{Name: "campaign service", External: true, Outputs: []string{schemas.TopicJobs, schemas.TopicPackages, schemas.TopicJobCommands}, Doc: "send jobs, uploaded number packages, and pause, resume or cancel of jobs (as `surge push` does)"},
	{Name: "operators", External: true, Outputs: []string{schemas.TopicExecCommands}, Doc: "drain an executor for an upgrade (`surge push drain --executor NAME`)"},
	{Name: "client apps", External: true, Outputs: []string{schemas.TopicClicks}, Doc: "clicks on delivered messages"},
	{Name: "account system", External: true, Outputs: []string{schemas.TopicIdentities}, Doc: "people's app accounts and their phone numbers (the unified account)"},
	{Name: "app platform", External: true, Outputs: []string{schemas.TopicUsage}, Doc: "usage that proves an account alive"},
	{Name: "registration service", External: true, Outputs: []string{schemas.TopicRegistrations, schemas.TopicPool}, Doc: "registrations; releases of unused uins (allocation is POST /v1/uins)"},
	{Name: "downstream systems", External: true, Reads: []string{schemas.TopicDeletions}, Doc: "delete their own data of recycled accounts"},
	{Name: "appeal flow", External: true, Outputs: []string{schemas.TopicRestoreReqs}, Reads: []string{schemas.TopicRestoreResults}, Doc: "asks for recycled accounts back (as does `surge uin restore`) and reads the answers"},
}

// All is every spec: surge's processors, then the platform's services.
func All() []streams.Spec { return append(Processors(), Platform...) }

// Describe is who produces and consumes each registry topic.
func Describe() []streams.TopicUse {
	names := make([]string, 0, len(schemas.Topics))
	for _, t := range schemas.Topics {
		names = append(names, t.Name)
	}
	return streams.Describe(All(), names)
}
