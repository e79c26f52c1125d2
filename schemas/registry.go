package schemas

import (
	"fmt"
	"sort"
	"strconv"

	"google.golang.org/protobuf/proto"

	"surge/schemas/surgev1"
)

// Record headers that carry the schema identity.
const (
	HeaderSchema  = "surge-schema"
	HeaderVersion = "surge-schema-version"
)

// Schema is one record type and the versions a reader accepts.
type Schema struct {
	Name       string // protobuf full name
	Version    int    // version written by this build
	MinVersion int    // oldest version this build still reads
	New        func() proto.Message

	// The header values every record of this schema carries, encoded once:
	// they are on every record of the hot paths. Shared, so never modified.
	nameHeader, versionHeader []byte
}

// NameHeader is the value of HeaderSchema for this schema (shared: do not
// modify it).
func (s Schema) NameHeader() []byte { return s.nameHeader }

// VersionHeader is the value of HeaderVersion this build writes (shared:
// do not modify it).
func (s Schema) VersionHeader() []byte { return s.versionHeader }

// Accepts reports whether a record written at version v can be read.
func (s Schema) Accepts(v int) bool { return v >= s.MinVersion && v <= s.Version }

var registry = map[string]Schema{}

func register(v, minV int, newFn func() proto.Message) {
	name := string(newFn().ProtoReflect().Descriptor().FullName())
	if _, dup := registry[name]; dup {
		panic("schemas: duplicate registration of " + name)
	}
	registry[name] = Schema{Name: name, Version: v, MinVersion: minV, New: newFn,
		nameHeader: []byte(name), versionHeader: []byte(strconv.Itoa(v))}
}

func init() {
	register(1, 1, func() proto.Message { return new(surgev1.LoginEvent) })
	register(1, 1, func() proto.Message { return new(surgev1.FanDelta) })
	register(1, 1, func() proto.Message { return new(surgev1.SendJob) })
	register(1, 1, func() proto.Message { return new(surgev1.JobTransition) })
	register(1, 1, func() proto.Message { return new(surgev1.SendTaskUnit) })
	register(1, 1, func() proto.Message { return new(surgev1.DeliveryReport) })
	register(1, 1, func() proto.Message { return new(surgev1.ExecutorLoad) })
	register(1, 1, func() proto.Message { return new(surgev1.OfflineEntry) })
	register(1, 1, func() proto.Message { return new(surgev1.OfflineBatch) })
	register(1, 1, func() proto.Message { return new(surgev1.AccountInfo) })
	register(1, 1, func() proto.Message { return new(surgev1.TagChange) })
	register(1, 1, func() proto.Message { return new(surgev1.BlacklistChange) })
	register(1, 1, func() proto.Message { return new(surgev1.PackageChunk) })
	register(1, 1, func() proto.Message { return new(surgev1.PlannerCheckpoint) })
	register(1, 1, func() proto.Message { return new(surgev1.JobCommand) })
	register(1, 1, func() proto.Message { return new(surgev1.ExecutorCommand) })
	register(1, 1, func() proto.Message { return new(surgev1.RewardGrant) })
	register(2, 1, func() proto.Message { return new(surgev1.Token) }) // v2: grant (field 14)
	register(1, 1, func() proto.Message { return new(surgev1.LedgerEntry) })
	register(1, 1, func() proto.Message { return new(surgev1.Withdrawal) })
	register(1, 1, func() proto.Message { return new(surgev1.PacketCredit) })
	register(1, 1, func() proto.Message { return new(surgev1.IdentityLink) })
	register(1, 1, func() proto.Message { return new(surgev1.StockChange) })
	register(1, 1, func() proto.Message { return new(surgev1.UinRegistration) })
	register(1, 1, func() proto.Message { return new(surgev1.UsageEvent) })
	register(2, 1, func() proto.Message { return new(surgev1.RecycleStep) }) // v2: batch (field 12)
	register(2, 1, func() proto.Message { return new(surgev1.PoolChange) })  // v2: uins (field 6), FREE and GIVEN_BACK
	register(1, 1, func() proto.Message { return new(surgev1.RegistrationCheck) })
	register(1, 1, func() proto.Message { return new(surgev1.Tracking) })
	register(1, 1, func() proto.Message { return new(surgev1.AccountBackup) })
	register(1, 1, func() proto.Message { return new(surgev1.RestoreRequest) })
	register(1, 1, func() proto.Message { return new(surgev1.RestoreResult) })
	register(1, 1, func() proto.Message { return new(surgev1.DeletionNotice) })
	register(1, 1, func() proto.Message { return new(surgev1.Timer) })
	register(1, 1, func() proto.Message { return new(surgev1.ReconResult) })
	register(1, 1, func() proto.Message { return new(surgev1.ClickEvent) })
	register(1, 1, func() proto.Message { return new(surgev1.JobClicks) })
}

// Lookup returns the schema registered under a protobuf full name.
func Lookup(name string) (Schema, bool) {
	s, ok := registry[name]
	return s, ok
}

// Of returns the schema of a message value; it panics for an unregistered
// type, which is a programming error caught by the registry test.
func Of(m proto.Message) Schema {
	name := string(m.ProtoReflect().Descriptor().FullName())
	s, ok := registry[name]
	if !ok {
		panic(fmt.Sprintf("schemas: %s is not registered", name))
	}
	return s
}

// All lists every registered schema by name.
func All() []Schema {
	out := make([]Schema, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
