package api

// Reads: balance, flow, the live total, stock and identities, answered by
// the owning instance.

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/processors/wallet/grant"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/ledger"
)

// readFailed answers a read the local ledger could not: one of a user
// whose partition another instance owns is sent on to that instance.
func (s *Server) readFailed(w http.ResponseWriter, r *http.Request, err error) {
	var notOwner *ledger.NotOwnerError
	if !errors.As(err, &notOwner) {
		fail(w, http.StatusServiceUnavailable, err)
		return
	}
	if by := r.Header.Get(forwardedHeader); by != "" {
		fail(w, http.StatusServiceUnavailable, fmt.Errorf("%w (sent here by %s; the group is rebalancing, retry)", err, by))
		return
	}
	owner, oerr := s.cfg.Ledger.Owner(r.Context(), r.PathValue("act"))
	if oerr != nil {
		fail(w, http.StatusServiceUnavailable, errors.Join(err, oerr))
		return
	}
	req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, strings.TrimSuffix(owner, "/")+r.URL.RequestURI(), nil)
	req.Header.Set(forwardedHeader, s.cfg.Advertise)
	req.Header.Set("Authorization", r.Header.Get("Authorization")) // the owner checks the caller again
	resp, ferr := ownerClient.Do(req)
	if ferr != nil {
		fail(w, http.StatusServiceUnavailable, fmt.Errorf("owner %s: %w", owner, ferr))
		return
	}
	defer resp.Body.Close()
	s.forwarded.Add(1)
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.Header().Set("X-Surge-Served-By", owner)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// ownerClient carries reads to their owner.
var ownerClient = &http.Client{Timeout: 2 * time.Second}

// Forwarded is how many reads this instance sent on to their owner.
func (s *Server) Forwarded() int64 { return s.forwarded.Load() }

func (s *Server) balance(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Ledger.Balance(r.Context(), r.PathValue("act"))
	if err != nil {
		s.readFailed(w, r, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"balance": v.Balance, "income": v.Income, "unbooked": v.Unbooked, "forged": v.Forged})
}

func (s *Server) flow(w http.ResponseWriter, r *http.Request) {
	page, err := intParam(r, "page", 0, 0, maxFlowPage)
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	size, err := intParam(r, "size", 20, 1, 100)
	if err != nil {
		fail(w, http.StatusBadRequest, err)
		return
	}
	items, v, err := s.cfg.Ledger.Flow(r.Context(), r.PathValue("act"), page, size)
	if err != nil {
		s.readFailed(w, r, err)
		return
	}
	out := make([]map[string]any, len(items))
	for i, it := range items {
		out[i] = map[string]any{"order_no": it.OrderNo, "kind": it.Kind.String(), "amount": it.Amount, "at_ms": it.AtMs, "booked": it.Booked}
	}
	reply(w, http.StatusOK, map[string]any{"items": out, "balance": v.Balance, "page": page, "size": size})
}

// maxFlowPage is the last page a flow read may ask for (a wallet's flow
// holds far fewer items than 100 a page times this).
const maxFlowPage = 1_000_000

// intParam reads query parameter name: def when absent, else a decimal
// integer within [lo, hi], or an error that says what is wrong.
func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	raw := r.URL.Query().Get(name)
	if raw == "" {
		return def, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want an integer from %d to %d", name, raw, lo, hi)
	}
	return n, nil
}

func (s *Server) total(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Counter == nil || s.cfg.Source.Tree().Degraded(guard.Counter) {
		fail(w, http.StatusServiceUnavailable, errors.New("live total switched off"))
		return
	}
	reply(w, http.StatusOK, map[string]any{"total": s.cfg.Counter.Shown()})
}

// identity answers an app account's actID (unified account, phone first).
func (s *Server) identity(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Identities == nil {
		fail(w, http.StatusServiceUnavailable, errors.New("no identity resolver"))
		return
	}
	act, err := s.cfg.Identities.ActID(r.Context(), r.PathValue("app"), r.PathValue("user"))
	switch {
	case errors.Is(err, identity.ErrUnknown):
		fail(w, http.StatusNotFound, err)
	case err != nil:
		fail(w, http.StatusServiceUnavailable, err)
	default:
		reply(w, http.StatusOK, map[string]string{"act_id": act})
	}
}

// stock answers an issuer's read of a coupon template's stock.
func (s *Server) stock(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Intake.StockOf(r.Context(), r.PathValue("template"))
	switch {
	case errors.Is(err, grant.ErrUnknownTemplate):
		fail(w, http.StatusNotFound, err)
	case err != nil:
		fail(w, http.StatusServiceUnavailable, err)
	default:
		reply(w, http.StatusOK, v)
	}
}

// releaseLock deletes a withdrawal lock only while it is still the
// caller's: after its TTL another withdrawal may hold it.
var releaseLock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)
