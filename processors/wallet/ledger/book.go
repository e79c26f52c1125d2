package ledger

// Booking: a token checked and booked once per order number.

import (
	"context"
	"fmt"
	"time"

	pb "surge/schemas/surgev1"
	"surge/streams"
)

// book books one token unless its order number already is. It returns
// whether it booked.
func (l *Ledger) book(ctx context.Context, tok *pb.Token, verify bool, verdict error, out *streams.Output) (bool, error) {
	if verify {
		verdict = l.cfg.Keys.Verify(tok)
	}
	if err := verdict; err != nil {
		l.Forged.Add(1)
		l.mForged.Inc()
		return false, streams.Reject("token refused: "+tok.OutTradeNo, err)
	}
	if tok.Amount <= 0 {
		return false, streams.Reject(fmt.Sprintf("token %s with amount %d", tok.OutTradeNo, tok.Amount), nil)
	}
	done, err := l.isBookedForBatch(tok.ActId, tok.OutTradeNo)
	if err != nil || done {
		return false, err
	}
	l.limit.SetRate(l.cfg.Source.Tree().RateLimits.BookingsPerSecond)
	if err := l.limit.Wait(ctx, 1); err != nil {
		return false, err
	}
	acc, err := l.accts.get(tok.ActId)
	if err != nil {
		return false, err
	}
	e := &pb.LedgerEntry{OrderNo: tok.OutTradeNo, ActId: tok.ActId, Amount: tok.Amount, Kind: pb.LedgerKind_GRANT,
		BookedAtMs: time.Now().UnixMilli(), ActivityId: tok.ActivityId, SceneId: tok.SceneId, BalanceAfter: acc.balance + tok.Amount,
		GrantedAtMs: tok.OpenTime}
	// The entry on wallet.ledger is the token's move to SUCCESS: the
	// changelog of bookings, keyed like the token. The status in Redis
	// follows once the transaction commits (batchEnd).
	if err := l.bookEntry(e, out); err != nil {
		return false, err
	}
	l.booked = append(l.booked, tok)
	l.Bookings.Add(1)
	l.mBooked.Inc()
	return true, nil
}

// bookEntry stages e in the open batch and emits it to wallet.ledger,
// encoded once for both.
func (l *Ledger) bookEntry(e *pb.LedgerEntry, out *streams.Output) error {
	r := streams.NewEncodedRecord(l.ledgerTopic, []byte(e.ActId), e, marshalEntry(e))
	ek, err := l.apply(l.staged, l.accts, e)
	if err != nil {
		return err
	}
	l.stagedOrders[string(ek)] = struct{}{}
	out.Emit(r)
	return nil
}
