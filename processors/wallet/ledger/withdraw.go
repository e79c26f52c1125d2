package ledger

// Withdrawals and red packets: a debit over the balance refused, a packet's
// credit booked once.

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/internal/guard"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// withdraw force-books the user's unbooked tokens, then books the
// withdrawal if the balance covers it; either way it answers on
// wallet.withdrawal-results. A withdrawal id is booked once. A red packet
// (ToActId set) is a withdrawal whose money goes to another user: its
// debit is booked the same way, and its credit goes to the receiver on
// wallet.packets in the same transaction.
func (l *Ledger) withdraw(ctx context.Context, w *pb.Withdrawal, out *streams.Output) error {
	answer := func(res *pb.Withdrawal) error {
		return out.EmitMsg(l.cfg.Topic(schemas.TopicWithdrawResult), []byte(w.ActId), res)
	}
	res := proto.Clone(w).(*pb.Withdrawal)
	what, orderNo, kind := "withdrawal", "w:"+w.WithdrawId, pb.LedgerKind_WITHDRAW
	if w.ToActId != "" {
		what, orderNo, kind = "red packet", "p:"+w.WithdrawId, pb.LedgerKind_P2P_PACKET
	}
	if w.WithdrawId == "" || w.ActId == "" || w.Amount <= 0 || w.ToActId == w.ActId {
		res.Refused, res.Reason = true, fmt.Sprintf("invalid %s: id %q, user %q, amount %d, to %q", what, w.WithdrawId, w.ActId, w.Amount, w.ToActId)
		return answer(res)
	}
	if done, err := l.isBookedForBatch(w.ActId, orderNo); err != nil || done {
		if done {
			res.Reason = "already booked"
			acc, _ := l.accts.get(w.ActId)
			res.BalanceAfter = acc.balance
			return answer(res)
		}
		return err
	}
	if l.cfg.Tokens != nil && !l.cfg.Source.Tree().Degraded(guard.TokenRedis) {
		toks, _, err := l.cfg.Tokens.All(ctx, w.ActId)
		if err != nil {
			return err // Redis down: retried, the withdrawal waits rather than misjudging the balance
		}
		for _, tok := range toks {
			if tok.Status != pb.TokenStatus_PROCESSING {
				continue
			}
			ok, err := l.book(ctx, tok, true, nil, out)
			if streams.IsReject(err) {
				continue // a forged token in Redis: counted, never booked
			}
			if err != nil {
				return err
			}
			if ok {
				res.ForceBooked++
			}
		}
	}
	acc, err := l.accts.get(w.ActId)
	if err != nil {
		return err
	}
	if acc.balance < w.Amount {
		l.Refused.Add(1)
		l.mRefused.Inc()
		res.Refused, res.Reason, res.BalanceAfter = true, fmt.Sprintf("over balance: %d requested, %d available", w.Amount, acc.balance), acc.balance
		return answer(res)
	}
	e := &pb.LedgerEntry{OrderNo: orderNo, ActId: w.ActId, Amount: -w.Amount, Kind: kind,
		BookedAtMs: time.Now().UnixMilli(), BalanceAfter: acc.balance - w.Amount}
	if err := l.bookEntry(e, out); err != nil {
		return err
	}
	if w.ToActId != "" {
		if err := out.EmitMsg(l.cfg.Topic(schemas.TopicPackets), []byte(w.ToActId), &pb.PacketCredit{PacketId: w.WithdrawId,
			FromActId: w.ActId, ToActId: w.ToActId, Amount: w.Amount, AtMs: e.BookedAtMs}); err != nil {
			return err
		}
	}
	res.BalanceAfter = e.BalanceAfter
	return answer(res)
}

// credit books a red packet's credit to its receiver, once per packet.
func (l *Ledger) credit(c *pb.PacketCredit, out *streams.Output) error {
	if c.PacketId == "" || c.ToActId == "" || c.Amount <= 0 {
		return streams.Reject(fmt.Sprintf("invalid red packet credit: id %q, to %q, amount %d", c.PacketId, c.ToActId, c.Amount), nil)
	}
	orderNo := "p:" + c.PacketId + ":in"
	if done, err := l.isBookedForBatch(c.ToActId, orderNo); err != nil || done {
		return err
	}
	acc, err := l.accts.get(c.ToActId)
	if err != nil {
		return err
	}
	return l.bookEntry(&pb.LedgerEntry{OrderNo: orderNo, ActId: c.ToActId, Amount: c.Amount, Kind: pb.LedgerKind_P2P_PACKET,
		BookedAtMs: time.Now().UnixMilli(), BalanceAfter: acc.balance + c.Amount}, out)
}

// View is what a user sees: booked plus unbooked, so the backlog is
// invisible.
type View struct {
	Balance, Income int64
	Unbooked        int // tokens not yet booked, included above
	Forged          int // tokens refused by the signature check
}

// Item is one line of the flow list.
type Item struct {
	OrderNo string
	Kind    pb.LedgerKind
	Amount  int64
	AtMs    int64
	Booked  bool
}
