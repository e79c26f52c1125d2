package schemas

import (
	"fmt"
	"strings"
	"time"
)

// Topic is the contract of one Kafka topic: what it carries, keyed by what,
// and how long the broker keeps it. Replay-based recovery depends on
// Retention: state that must be rebuildable from a topic lives on a
// compacted topic or one kept longer than the recovery window.
type Topic struct {
	Name       string
	Schema     string // protobuf full name; "" for the dead-letter topic (any payload)
	Key        string // what the record key is; partitioning follows the key
	Partitions int32
	Compacted  bool
	Retention  time.Duration // ignored when Compacted; Forever keeps every record
	Doc        string
}

// Topic names. Load-test traffic uses the same names behind ShadowPrefix.
const (
	TopicLogin          = "push.login"
	TopicPresence       = "push.presence"
	TopicFanDelta       = "push.fan-delta"
	TopicJobs           = "push.jobs"
	TopicJobTransitions = "push.job-transitions"
	TopicUnits          = "push.units"
	TopicReports        = "push.reports"
	TopicExecutors      = "push.executors"
	TopicExecCommands   = "push.executor-commands"
	TopicOffline        = "push.offline"
	TopicAccounts       = "push.accounts"
	TopicTags           = "push.tags"
	TopicBlacklists     = "push.blacklists"
	TopicPackages       = "push.packages"
	TopicClicks         = "push.clicks"
	TopicJobClicks      = "push.job-clicks"
	TopicPlannerCkpt    = "push.planner-checkpoints"
	TopicJobCommands    = "push.job-commands"
	TopicGrants         = "wallet.grants"
	TopicTokens         = "wallet.tokens"
	TopicLedger         = "wallet.ledger"
	TopicWithdrawals    = "wallet.withdrawals"
	TopicWithdrawResult = "wallet.withdrawal-results"
	TopicPackets        = "wallet.packets"
	TopicIdentities     = "wallet.identities"
	TopicRegistrations  = "uin.registrations"
	TopicUsage          = "uin.usage"
	TopicRecycleSteps   = "uin.recycle-steps"
	TopicPool           = "uin.pool"
	TopicChecks         = "uin.checks"
	TopicTracking       = "uin.tracking"
	TopicRecycleReqs    = "uin.recycle-requests"
	TopicBackups        = "uin.backups"
	TopicRestoreReqs    = "uin.restore-requests"
	TopicRestoreResults = "uin.restore-results"
	TopicDeletions      = "uin.deletions"
	TopicTimers         = "platform.timers"
	TopicRecon          = "platform.recon"
	TopicDeadLetter     = "platform.dlq"

	// ShadowPrefix marks load-test traffic: shadow topics and keys are
	// separate from real ones and expire (seed 002, full-link load test).
	ShadowPrefix = "shadow."
)

// Forever is the Retention of a log that is itself the state (uin.pool):
// no record is ever deleted.
const Forever time.Duration = -1

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// Topics is the registry of every topic the product uses.
var Topics = []Topic{
	{TopicLogin, "surge.v1.LoginEvent", "uin (4-byte big-endian)", 12, false, 3 * day, "login and logout events from the access layer"},
	{TopicPresence, "surge.v1.LoginEvent", "uin (4-byte big-endian)", 12, true, 0, "online-state changes only; compacted, so it is the latest state per uin"},
	{TopicFanDelta, "surge.v1.FanDelta", "account_id/uin (decimal)", 12, true, 0, "follow/unfollow changes to follower lists; compacted, so it is every account's follower list"},
	{TopicAccounts, "surge.v1.AccountInfo", "account_id (decimal)", 6, true, 0, "the public-account registry: type, default filters, follower count, daily job limit; a tombstone removes an account"},
	{TopicTags, "surge.v1.TagChange", "tag/uin", 12, true, 0, "targeting tags per user; compacted, so it is the tag index"},
	{TopicBlacklists, "surge.v1.BlacklistChange", "account_id/uin (decimal; account 0 is global)", 6, true, 0, "blacklisted users per account and global"},
	{TopicPackages, "surge.v1.PackageChunk", "package_id/index", 12, false, 30 * day, "number packages (uploaded, and the planner's filtered ones) in chunks of at most 256 KiB; job package_uri topic:push.packages/<id>"},
	{TopicClicks, "surge.v1.ClickEvent", "job_id", 6, false, 7 * day, "clicks on delivered messages; push-ctr counts them per job"},
	{TopicJobClicks, "surge.v1.JobClicks", "job_id", 6, true, 0, "per-job click-through (push-ctr's changelog); the planner sets each account's daily job quota by its last delivery's"},
	{TopicJobs, "surge.v1.SendJob", "job_id", 6, true, 0, "send jobs as submitted"},
	{TopicJobCommands, "surge.v1.JobCommand", "job_id", 6, false, 7 * day, "operators' pause, resume and cancel of send jobs (surge push pause|resume|cancel)"},
	{TopicJobTransitions, "surge.v1.JobTransition", "job_id", 6, false, 30 * day, "every state transition of every send job"},
	{TopicPlannerCkpt, "surge.v1.PlannerCheckpoint", "chunk index (decimal)", 1, true, 0, "checkpoints of the push planner's memory with their position in push.job-transitions; a restore replays only the transitions after the newest"},
	{TopicUnits, "surge.v1.SendTaskUnit", "job_id", 1, false, 7 * day, "per-executor unit queues are named push.units.<executor>: one partition, so units run in dispatch (priority) order"},
	{TopicExecutors, "surge.v1.ExecutorLoad", "executor", 1, false, 1 * day, "executor load reports; the planner dispatches by them"},
	{TopicExecCommands, "surge.v1.ExecutorCommand", "executor", 1, false, 1 * day, "operators' commands to executors: drain one for an upgrade (surge push drain --executor NAME)"},
	{TopicOffline, "surge.v1.OfflineBatch", "a uin of the batch (4-byte big-endian)", 12, false, 7 * day, "offline targets, co-partitioned with push.login; with the DELIVERED_ON_LOGIN reports it is the offline queues' changelog"},
	{TopicReports, "surge.v1.DeliveryReport", "job_id", 12, false, 7 * day, "per-target delivery outcomes; read back to rebuild remaining work"},
	{TopicGrants, "surge.v1.RewardGrant", "act_id", 12, false, 30 * day, "accepted reward grants other than cash (a cash grant rides in its token)"},
	{TopicTokens, "surge.v1.Token", "act_id", 12, false, 30 * day, "signed cash tokens (PROCESSING), each with its grant; a booking is its wallet.ledger entry"},
	{TopicLedger, "surge.v1.LedgerEntry", "act_id", 12, false, 365 * day, "booked ledger entries; the account store is rebuilt from it"},
	{TopicWithdrawals, "surge.v1.Withdrawal", "act_id", 12, false, 365 * day, "withdrawal requests"},
	{TopicWithdrawResult, "surge.v1.Withdrawal", "act_id", 12, false, 30 * day, "the ledger's answer to each withdrawal and red packet: booked or refused with a reason"},
	{TopicIdentities, "surge.v1.IdentityLink", "app:user_id", 12, true, 0, "people's app accounts and their phone numbers, from the account system; the wallet derives each one's actID phone first"},
	{TopicPackets, "surge.v1.PacketCredit", "act_id (the receiver)", 12, false, 365 * day, "person-to-person red packets on their way to the receiver: the ledger that debited the sender writes them, the receiver's books them"},
	{TopicRegistrations, "surge.v1.UinRegistration", "uin (4-byte big-endian)", 12, false, 400 * day, "uin allocations and registration completion"},
	{TopicUsage, "surge.v1.UsageEvent", "uin (4-byte big-endian)", 12, false, 30 * day, "usage events that prove an account alive"},
	{TopicRecycleSteps, "surge.v1.RecycleStep", "uin (4-byte big-endian)", 12, false, 400 * day, "every applied step of every recycle ticket; the recycle controller's changelog"},
	{TopicPool, "surge.v1.PoolChange", "bucket (4-byte big-endian)", 12, false, Forever, "every change of the uin pool (insertions, allocations, releases, frees), each on it before it takes effect: the pool's source of truth, folded back into Redis by `surge rebuild uin`; kept forever"},
	{TopicChecks, "surge.v1.RegistrationCheck", "uin (4-byte big-endian)", 12, false, 7 * day, "registration checkpoints, fired by the timer service; co-partitioned with uin.registrations"},
	{TopicTracking, "surge.v1.Tracking", "uin (4-byte big-endian)", 12, true, 0, "the registration tracker's state per uin; compacted changelog its store is rebuilt from"},
	{TopicRecycleReqs, "surge.v1.RecycleStep", "uin (4-byte big-endian)", 12, false, 30 * day, "requested recycle steps (ticket grants from the checks, timed steps from the timer service); applied only by compare-and-set"},
	{TopicBackups, "surge.v1.AccountBackup", "username", 12, true, 0, "backups of recycled accounts' core data, keyed by username; the restore tool reads them"},
	{TopicRestoreReqs, "surge.v1.RestoreRequest", "username", 6, false, 30 * day, "requests to bring recycled accounts back from their backups (operators, the appeal flow)"},
	{TopicRestoreResults, "surge.v1.RestoreResult", "username", 6, false, 30 * day, "the uin-restore service's answer to each restore request: the uin the account lives on, or why not"},
	{TopicDeletions, "surge.v1.DeletionNotice", "uin (4-byte big-endian)", 12, false, 30 * day, "deleted accounts: other systems delete their own data of them"},
	{TopicTimers, "surge.v1.Timer", "timer_id", 12, true, 0, "pending timers; compacted, a fired or cancelled timer is tombstoned"},
	{TopicRecon, "surge.v1.ReconResult", "check", 3, false, 90 * day, "reconciliation results and mismatches"},
	{TopicDeadLetter, "", "original key", 3, false, 30 * day, "records that failed to decode, validate or process, with the reason in headers"},
}

// TopicByName finds a topic in the registry, also under the shadow prefix.
func TopicByName(name string) (Topic, error) {
	base := name
	if len(name) > len(ShadowPrefix) && name[:len(ShadowPrefix)] == ShadowPrefix {
		base = name[len(ShadowPrefix):]
	}
	if strings.HasPrefix(base, TopicUnits+".") {
		base = TopicUnits // one executor's unit queue
	}
	for _, t := range Topics {
		if t.Name == base {
			t.Name = name
			return t, nil
		}
	}
	return Topic{}, fmt.Errorf("schemas: unknown topic %q", name)
}

// BrokerConfigs renders the topic's retention policy as broker configs.
func (t Topic) BrokerConfigs() map[string]string {
	if t.Compacted {
		return map[string]string{"cleanup.policy": "compact"}
	}
	ms := t.Retention.Milliseconds()
	if t.Retention < 0 {
		ms = -1 // Forever
	}
	return map[string]string{
		"cleanup.policy": "delete",
		"retention.ms":   fmt.Sprint(ms),
	}
}

// Namespaced returns the registry contracts of names, each renamed behind
// the namespace prefix ns (tests, benches and side-by-side stacks).
func Namespaced(ns string, names ...string) []Topic {
	out := make([]Topic, 0, len(names))
	for _, n := range names {
		t, err := TopicByName(n)
		if err != nil {
			panic(err) // a name not in the registry is a programming error
		}
		t.Name = ns + n
		out = append(out, t)
	}
	return out
}
