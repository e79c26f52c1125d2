package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/api"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/token"
	"surge/schemas"
	"surge/streams/streamstest"
)

func tree() *config.Tree {
	now := time.Now()
	return &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-time.Hour), End: now.Add(time.Hour)}},
		Scenes:   []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000}}}}}
}

func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s %s: %s", method, path, data)
	}
	return resp.StatusCode, out
}

func TestAPI(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ns := streamstest.Unique("api") + "."
		var names []string
		for _, n := range []string{schemas.TopicGrants, schemas.TopicTokens, schemas.TopicLedger, schemas.TopicWithdrawals, schemas.TopicWithdrawResult, schemas.TopicDeadLetter} {
			names = append(names, ns+n)
		}
		streamstest.CreateTopics(t, b.Brokers, 3, names...)
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		keys, _ := token.Generate("k")
		src := config.Static(tree())
		cl := streamstest.Client(t, b.Brokers, kgo.ProducerLinger(time.Millisecond))
		in := grant.New(grant.Deps{Config: src, Keys: keys, Redis: rdb, Producer: cl, Log: log, Namespace: ns})
		led := ledger.New(ledger.Config{Namespace: ns, Dir: t.TempDir(), Source: src, Keys: keys, Tokens: in.Tokens(), Log: log}, b.Brokers)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- led.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		batcher := grant.NewBatcher(in, 64, time.Millisecond, 2) // as `surge wallet` serves grants
		defer batcher.Close()
		s := &api.Server{Intake: in, Batcher: batcher, Ledger: led, Producer: cl, Redis: rdb, Config: src, Namespace: ns, Log: log}
		if err := s.FollowResults(ctx, b.Brokers); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		defer srv.Close()
		for !led.Ready() {
			time.Sleep(10 * time.Millisecond)
		}

		code, out := call(t, srv, "POST", "/v1/grants", `{"orderNo":"u1_rain_r1_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"r1","awardType":"CASH","stage":1,"amount":300}`)
		if code != 200 || out["token"] == nil || out["activity"] != "spring-live" {
			t.Fatalf("grant: %d %v", code, out)
		}
		code, out = call(t, srv, "POST", "/v1/grants", `{"orderNo":"bad","actId":"u1"}`)
		if code != 400 || !strings.Contains(out["error"].(string), "invalid grant") {
			t.Fatalf("bad grant: %d %v", code, out)
		}
		code, out = call(t, srv, "POST", "/v1/grants", `not json`)
		if code != 400 {
			t.Fatalf("malformed body: %d %v", code, out)
		}
		code, out = call(t, srv, "GET", "/v1/users/u1/balance", "")
		if code != 200 || out["balance"].(float64) != 300 {
			t.Fatalf("balance: %d %v", code, out)
		}
		code, out = call(t, srv, "POST", "/v1/users/u1/withdrawals", `{"withdraw_id":"w1","amount":500}`)
		if code != 409 || !strings.Contains(out["error"].(string), "over balance") {
			t.Fatalf("over-balance withdrawal: %d %v", code, out)
		}
		code, out = call(t, srv, "POST", "/v1/users/u1/withdrawals", `{"withdraw_id":"w2","amount":200}`)
		if code != 200 || out["balance_after"].(float64) != 100 {
			t.Fatalf("withdrawal: %d %v", code, out)
		}
		code, out = call(t, srv, "POST", "/v1/users/u1/withdrawals", `{"amount":-1}`)
		if code != 400 {
			t.Fatalf("bad withdrawal: %d %v", code, out)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, out = call(t, srv, "GET", "/v1/users/u1/flow?size=10", "")
			if items := out["items"].([]any); code == 200 && len(items) == 2 && items[0].(map[string]any)["kind"] == "WITHDRAW" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("flow: %d %v", code, out)
			}
			time.Sleep(20 * time.Millisecond)
		}

	})
}
