package ledger

// Rebuild: the account store's partitions cleared and replayed from
// wallet.ledger.

import (
	"github.com/twmb/franz-go/pkg/kgo"

	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
)

// clearPartitions drops the store's keys of the users in partitions ps.
func (l *Ledger) clearPartitions(ps map[int32]bool) error {
	// Balances live in memory until evicted: every cached balance goes to
	// the store (and leaves the cache) before the cleared partitions'
	// keys are deleted, so the others' survive and the cleared ones' are
	// rebuilt.
	if err := l.accts.flush(); err != nil {
		return err
	}
	if err := localstore.DeleteWhere(l.db, func(k []byte) bool {
		act := keyActID(k)
		return act != nil && ps[int32(streams.PartitionFor(act, l.partitions))]
	}); err != nil {
		return err
	}
	l.startRebuild()
	l.totals.clear(ps)
	return nil
}

// startRebuild opens the batch and balances a rebuild applies entries to.
func (l *Ledger) startRebuild() {
	l.rebuild, l.rebuildAccts = l.db.NewBatch(), newAccounts(l.db, maxCachedAccounts, l.keys)
}

// applyRestored books one entry of a rebuild (of a partition, or of the
// whole store at start) into the rebuild's own batch.
func (l *Ledger) applyRestored(r *kgo.Record) error {
	var e pb.LedgerEntry
	if streams.Decode(r, &e) != nil {
		return nil
	}
	if _, err := l.apply(l.rebuild, l.rebuildAccts, &e); err != nil {
		return err
	}
	if l.rebuild.Count() > 50000 {
		if err := l.commitBatch(l.rebuild, l.rebuildAccts); err != nil {
			return err
		}
		l.rebuild = l.db.NewBatch()
	}
	return nil
}

// finishRebuild commits the rebuild and hands its balances to the booking
// side's cache (which holds none of the rebuilt users: they were flushed
// out and dropped in clearPartitions, or the store is new).
func (l *Ledger) finishRebuild() error {
	err := l.commitBatch(l.rebuild, l.rebuildAccts)
	if err == nil {
		err = l.accts.adopt(l.rebuildAccts)
	}
	l.rebuild, l.rebuildAccts = nil, nil
	return err
}
