package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/api"
	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/order"
	pb "surge/schemas/surgev1"
)

// checkingGranter stands in for the intake: it answers each grant by the
// order-number check the intake makes first, and counts what it is given.
type checkingGranter struct{ given int }

func (c *checkingGranter) Grant(_ context.Context, g *pb.RewardGrant) (*grant.Result, error) {
	c.given++
	if err := order.Check(g); err != nil {
		return nil, fmt.Errorf("%w: %v", grant.ErrInvalid, err)
	}
	return &grant.Result{Activity: "fuzz"}, nil
}

func (c *checkingGranter) GrantBatch(ctx context.Context, gs []*pb.RewardGrant) []grant.Outcome {
	out := make([]grant.Outcome, len(gs))
	for i, g := range gs {
		out[i].Result, out[i].Err = c.Grant(ctx, g)
	}
	return out
}

// FuzzGrantRequests sends the grant endpoints any body, JSON or protobuf,
// signed (so parsing is reached) or with fuzzed signature headers: no
// handler panics, every answer is a client error or a success, and a
// batch answers each grant it was given, in order.
func FuzzGrantRequests(f *testing.F) {
	grantJSON := `{"orderNo":"u1_rain_r9_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"r9","awardType":"CASH","stage":1,"amount":700}`
	batchProto, _ := proto.Marshal(&pb.GrantBatch{Grants: []*pb.RewardGrant{{OrderNo: "u1_rain_r9_1_1", ActId: "u1", SceneId: "rain", RainId: "r9", AwardType: 1, Stage: 1, Amount: 7}}})
	f.Add(false, false, true, []byte(grantJSON), "")
	f.Add(true, false, true, []byte(`{"grants":[`+grantJSON+`,{"orderNo":1},null]}`), "")
	f.Add(true, true, true, batchProto, "")
	f.Add(true, true, false, batchProto, "ff")
	f.Add(false, false, true, []byte(`{"amount":"9223372036854775808"}`), "")
	f.Fuzz(func(t *testing.T, batch, asProto, sign bool, body []byte, sig string) {
		g := &checkingGranter{}
		s := api.New(api.Config{Apps: auth.NewApps([]auth.Key{appKey}), Users: auth.NewUsers([]auth.Key{userKey}), Batcher: g})
		path := "/v1/grants"
		if batch {
			path += "/batch"
		}
		req := httptest.NewRequest("POST", path, bytes.NewReader(body))
		if asProto {
			req.Header.Set("Content-Type", "application/x-protobuf")
		}
		auth.Sign(req, body, appKey, time.Now())
		real := req.Header.Get(auth.HeaderSignature)
		if !sign {
			req.Header.Set(auth.HeaderSignature, sig)
		}
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusConflict, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("%s %q: status %d: %s", path, body, w.Code, w.Body.String())
		}
		if !sign && w.Code != http.StatusUnauthorized && !strings.EqualFold(sig, real) {
			t.Fatalf("a fuzzed signature %q was accepted: %d", sig, w.Code)
		}
		if !batch || w.Code != http.StatusOK {
			return
		}
		var n int
		if asProto {
			var res pb.GrantResults
			if err := proto.Unmarshal(w.Body.Bytes(), &res); err != nil {
				t.Fatalf("batch answer: %v", err)
			}
			n = len(res.Results)
		} else {
			var res struct{ Results []map[string]any }
			if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
				t.Fatalf("batch answer: %v", err)
			}
			n = len(res.Results)
		}
		if n < g.given || n == 0 || n > api.MaxBatch {
			t.Fatalf("batch answered %d results for %d grants handed on", n, g.given)
		}
	})
}

// TestAppsOverTheirLimitGet429First: an app over rate_limits.grants_per_app
// is answered 429 with Retry-After before its grants reach the intake;
// another app and a raised limit are unaffected.
func TestAppsOverTheirLimitGet429First(t *testing.T) {
	tr := tree()
	tr.RateLimits.GrantsPerApp = map[string]int{"app": 50, "*": 1000}
	other := auth.Key{ID: "other-1", App: "other", Secret: []byte("abcdef0123456789abcdef0123456789")}
	g := &checkingGranter{}
	src := config.Static(tr)
	s := api.New(api.Config{Apps: auth.NewApps([]auth.Key{appKey, other}), Users: auth.NewUsers([]auth.Key{userKey}), Batcher: g, Source: src})
	h := s.Handler()
	batch := func(k auth.Key, n int) *httptest.ResponseRecorder {
		grants := make([]string, n)
		for i := range grants {
			grants[i] = fmt.Sprintf(`{"orderNo":"u%d_rain_r9_1_1","actId":"u%d","sceneId":"rain","rainId":"r9","awardType":"CASH","stage":1,"amount":7}`, i, i)
		}
		body := []byte(`{"grants":[` + strings.Join(grants, ",") + `]}`)
		req := httptest.NewRequest("POST", "/v1/grants/batch", bytes.NewReader(body))
		auth.Sign(req, body, k, time.Now())
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	if w := batch(appKey, 40); w.Code != 200 {
		t.Fatalf("40 grants within 50/s: %d %s", w.Code, w.Body)
	}
	given := g.given
	w := batch(appKey, 40)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("80 grants in a moment at 50/s: %d (Retry-After %q) %s", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if g.given != given {
		t.Fatalf("the refused batch reached the intake: %d grants", g.given-given)
	}
	if w := batch(other, 100); w.Code != 200 {
		t.Fatalf("another app under its own limit: %d %s", w.Code, w.Body)
	}
	raised := tree()
	raised.RateLimits.GrantsPerApp = map[string]int{"app": 100000}
	if err := src.Swap(raised); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the bucket refills at the new rate
	if w := batch(appKey, 40); w.Code != 200 {
		t.Fatalf("after the limit was raised: %d %s", w.Code, w.Body)
	}
}
