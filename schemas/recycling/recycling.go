// Package recycling is the vocabulary of uin recycling shared by its
// producers and consumers: the categories of recyclable uins, the usage
// kinds the recycle controller reacts to, and the builders of the
// requests on uin.recycle-requests.
package recycling

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Categories of recyclable uins (seed 003: gaps need no queue; they were
// never allocated and go straight to the pool).
const (
	Abandoned = "abandoned" // registration never completed
	Spam      = "spam"      // spam registration
	Inactive  = "inactive"  // inactive stock account
)

// Usage event kinds (uin.usage) the recycle controller reacts to.
const (
	KindLogin        = "login"         // a successful login (source: auth or device)
	KindUnban        = "unban"         // the account was unbanned (appeal, operator)
	KindLoginRefused = "login_refused" // a banned account tried to log in
)

// Request is the request for step to follow done, under done's ticket.
func Request(done *pb.RecycleStep, to pb.RecycleStepKind) *pb.RecycleStep {
	return &pb.RecycleStep{Uin: done.Uin, TicketId: done.TicketId, Step: to, ExpectedPrev: done.Step,
		Category: done.Category, Username: done.Username}
}

// Finding is what a check found recyclable: the uin, the registration it
// judged and the login evidence it saw.
type Finding struct {
	Uin            uint32
	Category       string // abandoned, spam, inactive
	Username       string
	Reason         string
	LastLoginMs    int64 // the newest login the check saw (either source)
	RegisteredAtMs int64 // when the judged registration was made
}

// Grant is the request that opens a ticket for a finding: what a check
// sends once it finds the uin recyclable. The controller refuses it if it
// knows a login newer than LastLoginMs, or if the uin was deleted after
// RegisteredAtMs (that registration was recycled already).
func Grant(f Finding, at time.Time) *pb.RecycleStep {
	return &pb.RecycleStep{Uin: uint64(f.Uin), Step: pb.RecycleStepKind_TICKET_GRANTED, Category: f.Category,
		Username: f.Username, Reason: f.Reason, LastLoginMs: f.LastLoginMs, RegisteredAtMs: f.RegisteredAtMs,
		AtMs: at.UnixMilli(), TicketId: fmt.Sprintf("%s-%d-%d", f.Category, f.Uin, at.UnixMilli())}
}

// MaxBatch is the most tickets a producer puts in one record's batch
// (about 70 KB of steps, far below the broker's message limit).
const MaxBatch = 1000

// Entries are the tickets' steps a record carries: its batch, or itself.
func Entries(s *pb.RecycleStep) []*pb.RecycleStep {
	if len(s.Batch) > 0 {
		return s.Batch
	}
	return []*pb.RecycleStep{s}
}

// Batch is the record that carries entries (at least one, all of one
// partition): the entry itself when it is alone, so a single ticket's
// record reads as it did before batches.
func Batch(entries []*pb.RecycleStep) *pb.RecycleStep {
	if len(entries) == 1 {
		return entries[0]
	}
	return &pb.RecycleStep{Batch: entries}
}

// Key is the key of the record that carries entries: its first uin's.
// The entries are of one partition, and the default partitioner puts the
// record in it; the controller refuses a record on another.
func Key(entries []*pb.RecycleStep) []byte { return schemas.UinKey(uint32(entries[0].Uin)) }

// Decode reads a record of uin.recycle-steps or uin.recycle-requests: the
// tickets' steps it carries (its batch, or itself).
func Decode(r *kgo.Record) ([]*pb.RecycleStep, error) {
	rec := new(pb.RecycleStep)
	if err := streams.Decode(r, rec); err != nil {
		return nil, err
	}
	return Entries(rec), nil
}

// StepsByUin decodes records of uin.recycle-steps (or of
// uin.recycle-requests), single tickets or batches, into each uin's steps
// in the records' order, and counts them.
func StepsByUin(recs []*kgo.Record) (map[uint64][]*pb.RecycleStep, int, error) {
	out := map[uint64][]*pb.RecycleStep{}
	n := 0
	for _, r := range recs {
		steps, err := Decode(r)
		if err != nil {
			return nil, 0, err
		}
		for _, st := range steps {
			out[st.Uin] = append(out[st.Uin], st)
			n++
		}
	}
	return out, n, nil
}

// Batches gathers tickets' steps into records' batches: per partition of
// uin.recycle-requests (the record is keyed by its first uin, and the
// default partitioner puts it where all of them belong), up to max each.
type Batches struct {
	partitions, max int
	pending         [][]*pb.RecycleStep
}

// NewBatches gathers for a topic of partitions partitions, max steps a
// batch (MaxBatch when max <= 0).
func NewBatches(partitions, max int) *Batches {
	if max <= 0 {
		max = MaxBatch
	}
	return &Batches{partitions: partitions, max: max, pending: make([][]*pb.RecycleStep, partitions)}
}

// Add adds a step; it returns its partition's batch when that is full (to
// be sent), nil otherwise.
func (b *Batches) Add(s *pb.RecycleStep) []*pb.RecycleStep {
	p := streams.PartitionFor(schemas.UinKey(uint32(s.Uin)), b.partitions)
	b.pending[p] = append(b.pending[p], s)
	if len(b.pending[p]) < b.max {
		return nil
	}
	full := b.pending[p]
	b.pending[p] = nil
	return full
}

// Rest returns the batches not full yet, and forgets them.
func (b *Batches) Rest() [][]*pb.RecycleStep {
	var rest [][]*pb.RecycleStep
	for p, s := range b.pending {
		if len(s) > 0 {
			rest = append(rest, s)
			b.pending[p] = nil
		}
	}
	return rest
}
