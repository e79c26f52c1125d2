package api

// Grants: one grant or a batch, signed by an app, answered with each
// grant's outcome.

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/auth"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/internal/stock"
	pb "surge/schemas/surgev1"
	"surge/streams/httperr"
)

func (s *Server) grant(w http.ResponseWriter, r *http.Request) {
	var g pb.RewardGrant
	app, body, ok := s.signedBody(w, r, 64<<10, "grant")
	if !ok || s.overAppLimit(w, app, 1) {
		return
	}
	if err := protojson.Unmarshal(body, &g); err != nil {
		fail(w, http.StatusBadRequest, fmt.Errorf("malformed grant: %w", err))
		return
	}
	code, out := s.grantOne(r.Context(), app, &g, true)
	reply(w, code, out)
}

// MaxBatch is the most grants one batch request may carry.
const MaxBatch = 1000

// grantBatch accepts up to MaxBatch grants in one signed request: the
// shape an activity service uses at the peak (one signature and one round
// trip for many grants). Each grant is answered on its own, in order,
// with the code and body /v1/grants would give it, less the token. The
// body is JSON ({"grants": [...]}), or with Content-Type
// application/x-protobuf a GrantBatch, answered with GrantResults:
// decoding and encoding JSON was a third of the batch's CPU.
func (s *Server) grantBatch(w http.ResponseWriter, r *http.Request) {
	app, body, ok := s.signedBody(w, r, 4<<20, "batch")
	if !ok {
		return
	}
	results := s.decodeBatch(w, r, body)
	if results == nil || s.overAppLimit(w, app, len(results)) {
		return
	}
	var gs []*pb.RewardGrant
	var asked []*batchItem
	for _, res := range results {
		if res.grant == nil {
			continue
		}
		if res.code, res.err = s.mayGrant(app, res.grant); res.err != nil {
			continue
		}
		gs, asked = append(gs, res.grant), append(asked, res)
	}
	for i, o := range s.granter().GrantBatch(r.Context(), gs) {
		asked[i].result, asked[i].err, asked[i].code = o.Result, o.Err, codeOf(o.Err)
	}
	if isProto(r) {
		out := &pb.GrantResults{Results: make([]*pb.GrantResult, len(results))}
		for i, res := range results {
			gr := &pb.GrantResult{Code: uint32(res.code)}
			if res.err != nil {
				gr.Error = res.err.Error()
			} else {
				gr.Duplicate, gr.Activity = res.result.Duplicate, res.result.Activity
			}
			out.Results[i] = gr
		}
		b, _ := proto.Marshal(out)
		w.Header().Set("Content-Type", protoType)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return
	}
	out := make([]map[string]any, len(results))
	for i, res := range results {
		// A caller at the peak needs the answer, not the signed token:
		// encoding it was a third of the batch's CPU.
		out[i] = answer(res.code, res.result, res.err, false)
		// An item's "code" is its HTTP status, as it always was; its
		// error's kind is "error_code".
		if kind, ok := out[i]["code"]; ok {
			out[i]["error_code"] = kind
		}
		out[i]["code"] = res.code
	}
	reply(w, http.StatusOK, map[string]any{"results": out})
}

// protoType is the media type of protobuf request and answer bodies.
const protoType = "application/x-protobuf"

func isProto(r *http.Request) bool {
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	return strings.TrimSpace(ct) == protoType
}

// batchItem is one grant of a batch and its answer.
type batchItem struct {
	grant  *pb.RewardGrant // nil when it did not decode
	code   int
	result *grant.Result // nil when err is set
	err    error
}

// decodeBatch reads a batch's grants from a JSON or protobuf body. A grant
// that does not decode is answered 400 on its own; a body that is not a
// batch of 1..MaxBatch grants is answered 400 here, and nil returned.
func (s *Server) decodeBatch(w http.ResponseWriter, r *http.Request, body []byte) []*batchItem {
	var items []*batchItem
	if isProto(r) {
		var b pb.GrantBatch
		if err := proto.Unmarshal(body, &b); err != nil || len(b.Grants) == 0 || len(b.Grants) > MaxBatch {
			fail(w, http.StatusBadRequest, fmt.Errorf("want a surge.v1.GrantBatch of 1..%d grants (%v)", MaxBatch, err))
			return nil
		}
		for _, g := range b.Grants {
			items = append(items, &batchItem{grant: g})
		}
		return items
	}
	var req struct {
		Grants []json.RawMessage `json:"grants"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Grants) == 0 || len(req.Grants) > MaxBatch {
		fail(w, http.StatusBadRequest, fmt.Errorf("want {\"grants\": [1..%d grants]}", MaxBatch))
		return nil
	}
	for _, raw := range req.Grants {
		var g pb.RewardGrant
		if err := protojson.Unmarshal(raw, &g); err != nil {
			items = append(items, &batchItem{code: http.StatusBadRequest, err: fmt.Errorf("malformed grant: %w", err)})
			continue
		}
		items = append(items, &batchItem{grant: &g})
	}
	return items
}

// grantOne accepts g for app ("" with authentication off) and returns the
// HTTP code and body of its answer, with the signed token if withToken.
func (s *Server) grantOne(ctx context.Context, app string, g *pb.RewardGrant, withToken bool) (int, map[string]any) {
	code, res, err := s.accept(ctx, app, g)
	return code, answer(code, res, err, withToken)
}

// accept grants g for app ("" with authentication off): the HTTP code of
// the outcome, the intake's result, and its error.
func (s *Server) accept(ctx context.Context, app string, g *pb.RewardGrant) (int, *grant.Result, error) {
	if code, err := s.mayGrant(app, g); err != nil {
		return code, nil, err
	}
	res, err := s.granter().Grant(ctx, g)
	return codeOf(err), res, err
}

// mayGrant checks that app ("" with authentication off) may make g, and
// makes it in app's name when g names none.
func (s *Server) mayGrant(app string, g *pb.RewardGrant) (int, error) {
	switch {
	case app == "" || g.AppId == app:
	case g.AppId == "":
		g.AppId = app
	default:
		return http.StatusForbidden, fmt.Errorf("%w: app %s may not grant as app %s", auth.ErrForbidden, app, g.AppId)
	}
	return http.StatusOK, nil
}

func (s *Server) granter() Granter {
	if s.cfg.Batcher != nil {
		return s.cfg.Batcher
	}
	return s.cfg.Intake
}

// codeOf is the HTTP code of a grant's outcome.
func codeOf(err error) int {
	code := http.StatusOK
	switch {
	case errors.Is(err, grant.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, grant.ErrInvalid), errors.Is(err, grant.ErrOverCap):
		code = http.StatusBadRequest
	case errors.Is(err, grant.ErrRateLimited):
		code = http.StatusTooManyRequests
	case errors.Is(err, grant.ErrOverBudget), errors.Is(err, stock.ErrOut), errors.Is(err, stock.ErrLow), errors.Is(err, grant.ErrDegraded):
		code = http.StatusConflict
	case err != nil:
		code = http.StatusServiceUnavailable
	}
	return code
}

// answer is the JSON body of one grant's outcome, answered with status.
func answer(status int, res *grant.Result, err error, withToken bool) map[string]any {
	if err != nil {
		return map[string]any{"error": err.Error(), "code": httperr.ForStatus(status)}
	}
	out := map[string]any{"duplicate": res.Duplicate, "activity": res.Activity}
	if res.Token != nil && withToken {
		tj, _ := protojson.Marshal(res.Token)
		out["token"] = json.RawMessage(tj)
	}
	return out
}

// forwardedHeader marks a read sent on by another instance: it is
// answered here or refused, never sent on again.
const forwardedHeader = "X-Surge-Forwarded-By"
