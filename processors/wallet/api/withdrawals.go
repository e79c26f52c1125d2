package api

// Withdrawals and red packets: published to wallet.withdrawals, answered
// once the ledger's result comes back.

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"surge/processors/wallet/internal/guard"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/httperr"
)

// waiterKey names the request waiting for a ledger answer: withdrawals
// and red packets have ids of their own.
func waiterKey(w *pb.Withdrawal) string {
	if w.ToActId != "" {
		return "p:" + w.WithdrawId
	}
	return "w:" + w.WithdrawId
}

func (s *Server) withdraw(w http.ResponseWriter, r *http.Request) {
	var req struct {
		WithdrawID string `json:"withdraw_id"`
		Amount     int64  `json:"amount"`
	}
	body, ok := readBody(w, r, 4<<10, "withdrawal")
	if !ok {
		return
	}
	if err := json.Unmarshal(body, &req); err != nil || req.WithdrawID == "" || req.Amount <= 0 {
		fail(w, http.StatusBadRequest, errors.New("want {\"withdraw_id\": non-empty, \"amount\": positive cents}"))
		return
	}
	s.moveOut(w, r, &pb.Withdrawal{WithdrawId: req.WithdrawID, ActId: r.PathValue("act"), Amount: req.Amount})
}

// packet sends a person-to-person red packet from the path's user.
func (s *Server) packet(w http.ResponseWriter, r *http.Request) {
	var req struct {
		PacketID string `json:"packet_id"`
		To       string `json:"to"`
		Amount   int64  `json:"amount"`
	}
	act := r.PathValue("act")
	body, ok := readBody(w, r, 4<<10, "red packet")
	if !ok {
		return
	}
	if err := json.Unmarshal(body, &req); err != nil || req.PacketID == "" || req.To == "" || req.To == act || req.Amount <= 0 {
		fail(w, http.StatusBadRequest, errors.New("want {\"packet_id\": non-empty, \"to\": another user's actID, \"amount\": positive cents}"))
		return
	}
	s.moveOut(w, r, &pb.Withdrawal{WithdrawId: req.PacketID, ActId: act, Amount: req.Amount, ToActId: req.To})
}

// moveOut takes money out of a user's balance, a withdrawal or a red
// packet: the ledger books it (the user's unbooked tokens first) and
// answers on wallet.withdrawal-results.
func (s *Server) moveOut(w http.ResponseWriter, r *http.Request, req *pb.Withdrawal) {
	act, key := req.ActId, waiterKey(req)
	ctx := r.Context()
	// One withdrawal per user at a time (a double-clicked button); the
	// ledger's per-user order keeps the balance right even without it.
	if !s.cfg.Source.Tree().Degraded(guard.Lock) {
		lock := s.cfg.Namespace + "wlock:" + act
		ok, err := s.cfg.Redis.SetNX(ctx, lock, key, 10*time.Second).Result()
		if err == nil && !ok {
			// A retry of the same withdrawal or packet (its first try's instance
			// died holding the lock) goes on: the ledger books an id once.
			if holder, _ := s.cfg.Redis.Get(ctx, lock).Result(); holder != key {
				fail(w, http.StatusConflict, errors.New("another withdrawal of this user is in progress"))
				return
			}
		}
		if err == nil {
			defer releaseLock.Run(context.WithoutCancel(ctx), s.cfg.Redis, []string{lock}, key)
		}
	}
	ch := make(chan *pb.Withdrawal, 1)
	s.mu.Lock()
	if s.waiters == nil {
		s.waiters = map[string]chan *pb.Withdrawal{}
	}
	s.waiters[key] = ch
	s.mu.Unlock()
	defer func() { s.mu.Lock(); delete(s.waiters, key); s.mu.Unlock() }()
	req.AtMs = s.now().UnixMilli()
	rec, err := streams.NewRecord(s.cfg.Namespace+schemas.TopicWithdrawals, []byte(act), req)
	if err == nil {
		err = s.cfg.Producer.ProduceSync(ctx, rec).FirstErr()
	}
	if err != nil {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	timeout := s.cfg.Timeout
	select {
	case res := <-ch:
		idKey := "withdraw_id"
		if req.ToActId != "" {
			idKey = "packet_id"
		}
		body := map[string]any{idKey: res.WithdrawId, "balance_after": res.BalanceAfter, "force_booked": res.ForceBooked}
		if res.Refused {
			body["error"], body["code"] = res.Reason, httperr.Conflict
			reply(w, http.StatusConflict, body)
			return
		}
		reply(w, http.StatusOK, body)
	case <-time.After(timeout):
		fail(w, http.StatusAccepted, errors.New("accepted; the ledger has not answered yet (retry with the same id)"))
	case <-ctx.Done():
	}
}
