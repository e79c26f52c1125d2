package streams

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"surge/streams/metrics"
)

// An exactly-once instance killed with -9 leaves its transaction open:
// its outputs hold back the last stable offset of every partition they
// went to, and its pending offsets block the group's offset fetches, until
// the broker times the transaction out (transaction.timeout.ms, checked
// every 10 s). Whoever takes over waits that long before it can read.
// Two things end such a transaction at once instead:
//
//   - a session initialises its producer id when it starts, not at its
//     first transaction: a restarted instance (same transactional id)
//     fences its dead self even while it is a standby that gets nothing;
//   - orphanFencer: every instance looks, every fenceEvery, for open
//     transactions of its group's transactional ids whose instance is no
//     longer a member, and fences them (InitProducerID with their id bumps
//     the epoch and aborts what was open), so a survivor does not wait
//     for an instance that is never coming back.
//
// Fencing a live instance would only abort its batch (it is consumed
// again); that is avoided by fencing only ids of no current member whose
// transaction has been open longer than fenceAge (a batch's transaction
// lasts well under a second).

const (
	fenceEvery = time.Second
	fenceAge   = 3 * time.Second
)

type orphanFencer struct {
	cl       *kgo.Client
	adm      *kadm.Client
	group    string
	own      string // this instance's transactional id
	clientID func(instance string) string
	txnIDOf  func(instance string) string
	log      *slog.Logger
	fenced   metrics.Counter
}

// run fences orphans until ctx ends. A broker without ListTransactions
// (before Kafka 3.0, or the embedded one) turns it off.
func (f *orphanFencer) run(ctx context.Context) {
	t := time.NewTicker(fenceEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := f.once(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, kerr.UnsupportedVersion) || errors.Is(err, kerr.ClusterAuthorizationFailed) ||
				errors.Is(err, kerr.TransactionalIDAuthorizationFailed) || errors.Is(err, errNoListTransactions) {
				f.log.Debug("not fencing departed instances' transactions: the broker does not list them", "err", err)
				return
			}
			f.log.Debug("fencing departed instances' transactions", "err", err)
		}
	}
}

var errNoListTransactions = errors.New("streams: broker does not list transactions")

// once fences the orphans open now; it returns the first error.
func (f *orphanFencer) once(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	listed, err := f.adm.ListTransactions(cctx, nil, []string{"Ongoing"})
	if err != nil {
		var se *kadm.ShardErrors
		if errors.As(err, &se) && len(se.Errs) > 0 && errors.Is(se.Errs[0].Err, kerr.UnsupportedVersion) {
			return errNoListTransactions
		}
		return err
	}
	var candidates []string
	for id, t := range listed {
		if id != f.own && strings.HasPrefix(id, f.group+"-") && t.State == "Ongoing" {
			candidates = append(candidates, id)
		}
	}
	if len(candidates) == 0 {
		return nil
	}
	groups, err := f.adm.DescribeGroups(cctx, f.group)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, m := range groups[f.group].Members {
		live[m.ClientID] = true
	}
	described, err := f.adm.DescribeTransactions(cctx, candidates...)
	if err != nil {
		return err
	}
	for _, id := range candidates {
		instance := strings.TrimPrefix(id, f.group+"-")
		d, ok := described[id]
		if live[f.clientID(instance)] || !ok || d.Err != nil || d.State != "Ongoing" {
			continue
		}
		if time.Since(time.UnixMilli(d.StartTimestamp)) < fenceAge {
			continue
		}
		if err := fence(cctx, f.cl, id); err != nil {
			return err
		}
		f.fenced.Inc()
		f.log.Info("fenced the open transaction of a departed instance", "transactional_id", id,
			"open_for", time.Since(time.UnixMilli(d.StartTimestamp)).Round(time.Millisecond))
	}
	return nil
}

// fence bumps the epoch of transactional id txnID, which aborts its open
// transaction (and fences its producer, should it come back).
func fence(ctx context.Context, cl *kgo.Client, txnID string) error {
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &txnID
	req.TransactionTimeoutMillis = 60_000
	req.ProducerID, req.ProducerEpoch = -1, -1
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	err = kerr.ErrorForCode(resp.ErrorCode)
	if errors.Is(err, kerr.ConcurrentTransactions) {
		return nil // the coordinator is aborting it now: what was asked for
	}
	return err
}
