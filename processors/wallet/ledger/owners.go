package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"surge/streams"
)

// A user's reads are answered by the instance that owns the user's
// partition, once that partition is rebuilt there: any other instance's
// store holds that user's state as it was when it last owned it, if ever.
// Instances find each other through the consumer group: each joins with a
// client id carrying the address of its API (Config.Advertise) and an id of
// its own, and the group's assignment says who owns which partition (Kafka
// Streams calls this interactive queries). The assignment as the group
// describes it is also how an instance knows it still owns a partition:
// its own revocation callbacks are not reliable inside a transactional
// session (kgo's session skips them once a revocation is pending), and a
// read answered from a partition that moved away would be stale.

// NotOwnerError is a read of a user whose partition this instance does not
// serve (another instance owns it, or the group is rebalancing).
type NotOwnerError struct{ Partition int32 }

func (e *NotOwnerError) Error() string {
	return fmt.Sprintf("ledger: partition %d is not served here", e.Partition)
}

// advertisePrefix starts a ledger's client id: "surge-wallet-ledger@" +
// the address of its API (may be empty) + "#" + the instance's own id.
const advertisePrefix = "surge-wallet-ledger@"

func (l *Ledger) partitionOf(actID string) int32 {
	return int32(streams.PartitionFor([]byte(actID), l.partitions))
}

// servesPartition reports whether this instance answers reads of p: the
// group assigns p to it, and p is rebuilt here.
func (l *Ledger) servesPartition(ctx context.Context, p int32) bool {
	if !l.ready.Load() || !l.restore.Current(p) {
		return false
	}
	id, err := l.owners.lookup(ctx, p)
	return err == nil && id == l.owners.self
}

// Serves reports whether this instance answers reads of actID now.
func (l *Ledger) Serves(actID string) bool {
	return l.servesPartition(context.Background(), l.partitionOf(actID))
}

// Serving is the number of partitions whose reads this instance answers.
func (l *Ledger) Serving() int {
	if !l.ready.Load() {
		return 0
	}
	n := 0
	for _, p := range l.restore.Owned() {
		if l.servesPartition(context.Background(), p) {
			n++
		}
	}
	return n
}

// Owner returns the advertised API address of the instance that owns
// actID's partition, from the group's current assignment.
func (l *Ledger) Owner(ctx context.Context, actID string) (string, error) {
	if !l.ready.Load() {
		return "", fmt.Errorf("ledger: not started")
	}
	p := l.partitionOf(actID)
	id, err := l.owners.lookup(ctx, p)
	if err != nil {
		return "", err
	}
	addr, _, _ := strings.Cut(id, "#")
	if addr == "" {
		return "", fmt.Errorf("ledger: the owner of partition %d advertises no address", p)
	}
	return addr, nil
}

// owners caches the group's partition -> owner map; an owner is the part
// of its client id after advertisePrefix ("address#id").
type owners struct {
	kafka streams.Cluster
	group string
	topic string // the input whose partitions the users are spread over
	self  string // this instance, as it names itself in its client id

	mu      sync.Mutex
	adm     *kadm.Client
	fetched time.Time
	owner   map[int32]string
}

// ownersTTL is how long an assignment is trusted (reads may lag a
// rebalance that bypasses this instance's callbacks by that much); a
// lookup that misses refreshes it sooner, at most every ownersRetry.
const (
	ownersTTL   = 250 * time.Millisecond
	ownersRetry = 100 * time.Millisecond
)

// invalidate makes the next lookup ask the group: this instance's
// assignment just changed.
func (o *owners) invalidate() {
	o.mu.Lock()
	o.fetched = time.Time{}
	o.mu.Unlock()
}

func (o *owners) lookup(ctx context.Context, p int32) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	age := time.Since(o.fetched)
	if id, ok := o.owner[p]; ok && age < ownersTTL {
		return id, nil
	}
	if age >= ownersRetry {
		if err := o.refresh(ctx); err != nil {
			return "", err
		}
	}
	if id, ok := o.owner[p]; ok {
		return id, nil
	}
	return "", fmt.Errorf("ledger: partition %d has no owner in group %s (rebalance in progress?)", p, o.group)
}

func (o *owners) refresh(ctx context.Context) error {
	if o.adm == nil {
		cl, err := o.kafka.NewClient()
		if err != nil {
			return err
		}
		o.adm = kadm.NewClient(cl)
	}
	// Reads wait on this under the lock: a broker that does not answer
	// must not hold them longer than a read's patience.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	gs, err := o.adm.DescribeGroups(ctx, o.group)
	g, ok := gs[o.group]
	if err == nil && (!ok || g.Err != nil) {
		err = fmt.Errorf("%v", g.Err)
	}
	if err != nil {
		// The client keeps the group's coordinator it found; when that
		// broker died, it would ask the dead one again and again. The
		// next lookup starts from a new client, which finds the new one.
		o.adm.Close()
		o.adm = nil
		return fmt.Errorf("ledger: describe group %s: %w", o.group, err)
	}
	owner := map[int32]string{}
	for _, m := range g.Members {
		id, found := strings.CutPrefix(m.ClientID, advertisePrefix)
		ca, isConsumer := m.Assigned.AsConsumer()
		if !found || !isConsumer {
			continue
		}
		for _, t := range ca.Topics {
			if t.Topic == o.topic {
				for _, p := range t.Partitions {
					owner[p] = id
				}
			}
		}
	}
	o.owner, o.fetched = owner, time.Now()
	return nil
}

func (o *owners) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.adm != nil {
		o.adm.Close()
		o.adm = nil
	}
}

// instanceNonce tells instances with one address apart (and tests that
// run several in one process).
func instanceNonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
