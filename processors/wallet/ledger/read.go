package ledger

// Reads: a user's balance and flow, unbooked tokens included.

import (
	"context"
	"errors"
	"sort"

	"github.com/cockroachdb/pebble/v2"

	"surge/processors/wallet/internal/guard"
	pb "surge/schemas/surgev1"
)

// Balance returns the user's balance and total income.
func (l *Ledger) Balance(ctx context.Context, actID string) (View, error) {
	v, _, err := l.read(ctx, actID, false)
	return v, err
}

// Flow returns one page of the user's flow list, newest first: booked
// entries (grants, withdrawals, person-to-person packets) and unbooked
// tokens merged.
func (l *Ledger) Flow(ctx context.Context, actID string, page, size int) ([]Item, View, error) {
	v, items, err := l.read(ctx, actID, true)
	if err != nil {
		return nil, v, err
	}
	if page < 0 || size <= 0 || page > len(items)/size { // also where page*size would overflow
		return nil, v, nil
	}
	lo := page * size
	return items[lo:min(lo+size, len(items))], v, nil
}

func (l *Ledger) read(ctx context.Context, actID string, flow bool) (View, []Item, error) {
	var v View
	if !l.ready.Load() {
		return v, nil, errors.New("ledger: store not rebuilt yet")
	}
	if p := l.partitionOf(actID); !l.servesPartition(ctx, p) {
		return v, nil, &NotOwnerError{Partition: p}
	}
	// The user's tokens first, then the store as one commit left it: a
	// token is then either in the booked balance or counted as unbooked,
	// never neither (a commit between reading the balance and asking
	// "booked?" used to drop a batch's tokens from the view).
	var toks []*pb.Token
	if l.cfg.Tokens != nil && !l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
		var bad int
		// Redis down: no tokens, and the view degrades to what is booked.
		toks, bad, _ = l.cfg.Tokens.All(ctx, actID)
		v.Forged += bad
	}
	var items []Item
	var unbooked []*pb.Token
	err := func() error {
		l.commitMu.RLock()
		defer l.commitMu.RUnlock()
		acc, err := l.accts.getCommitted(actID)
		if err != nil {
			return err
		}
		v.Balance, v.Income = acc.balance, acc.income
		if flow {
			lo := append(append([]byte{'e'}, actID...), 0)
			hi := append(append([]byte{'e'}, actID...), 1)
			it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
			if err != nil {
				return err
			}
			for ok := it.First(); ok; ok = it.Next() {
				if kind, amount, at, ok := parseStoredEntry(it.Value()); ok {
					items = append(items, Item{OrderNo: string(it.Key()[len(lo):]), Kind: kind, Amount: amount, AtMs: at, Booked: true})
				}
			}
			it.Close()
		}
		for _, tok := range toks {
			if tok.Status == pb.TokenStatus_SUCCESS {
				continue // marked once its booking committed: in the balance
			}
			if ok, _ := l.isBooked(entryKey(tok.ActId, tok.OutTradeNo)); ok {
				continue // booked; Redis not updated yet
			}
			unbooked = append(unbooked, tok)
		}
		return nil
	}()
	if err != nil {
		return v, nil, err
	}
	for _, tok := range unbooked {
		if l.seen.Verify(l.cfg.Keys, tok) != nil || tok.ActId != actID {
			v.Forged++
			l.Forged.Add(1)
			l.mForged.Inc()
			continue
		}
		v.Balance += tok.Amount
		v.Income += tok.Amount
		v.Unbooked++
		if flow {
			items = append(items, Item{OrderNo: tok.OutTradeNo, Kind: pb.LedgerKind_GRANT, Amount: tok.Amount, AtMs: tok.OpenTime})
		}
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].AtMs > items[b].AtMs })
	return v, items, nil
}
