package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/api"
	walletapp "surge/processors/wallet/app"
	"surge/processors/wallet/auth"
	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/identity"
	"surge/processors/wallet/internal/stock"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/token"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/httperr"
	"surge/streams/streamstest"

	"google.golang.org/protobuf/proto"
)

func tree() *config.Tree {
	now := time.Now()
	return &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-time.Hour), End: now.Add(time.Hour)}},
		Scenes: []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000}, {ID: "coupon", Award: "coupon", MaxAmount: 5},
			{ID: "limited", Award: "coupon", MaxAmount: 5, Template: "tpl-lim", Stock: 100, Switches: config.Switches{StockControl: true}}}}}}
}

// The test's credentials: app "app" signs grants with appKey, user
// tokens are issued with users' first key.
var (
	appKey  = auth.Key{ID: "app-1", App: "app", Secret: []byte("0123456789abcdef0123456789abcdef")}
	userKey = auth.Key{ID: "u-1", Secret: []byte("fedcba9876543210fedcba9876543210")}
	apps    = auth.NewApps([]auth.Key{appKey})
	users   = auth.NewUsers([]auth.Key{userKey})
)

// credentials signs a request as the deployed callers do: a grant with
// the app's key, a user's endpoint with a token for the path's user.
func credentials(t *testing.T) func(*http.Request, []byte) {
	return func(req *http.Request, body []byte) {
		p := req.URL.Path
		switch {
		case p == "/v1/grants", p == "/v1/grants/batch", strings.HasPrefix(p, "/v1/identities/"):
			auth.Sign(req, body, appKey, time.Now())
		case strings.HasPrefix(p, "/v1/users/"):
			act := strings.SplitN(strings.TrimPrefix(p, "/v1/users/"), "/", 2)[0]
			tok, err := users.Issue(act, time.Hour, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
		default:
			tok, _ := users.Issue("reader", time.Hour, time.Now())
			req.Header.Set("Authorization", "Bearer "+tok)
		}
	}
}

func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, map[string]any) {
	t.Helper()
	return callWith(t, srv, method, path, body, credentials(t))
}

// callWith sends a request with the credentials sign sets (nil: none).
func callWith(t *testing.T, srv *httptest.Server, method, path, body string, sign func(*http.Request, []byte)) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if sign != nil {
		sign(req, []byte(body))
	}
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

// stack is what an API instance stands on: the wallet's topics (in
// namespace ns), a signing key, the config, a producer and the intake.
type stack struct {
	log  *slog.Logger
	keys *token.Keyring
	src  *config.Source
	cl   *kgo.Client
	in   *grant.Intake
}

func newStack(t *testing.T, b streamstest.Backend, rdb redis.UniversalClient, ns string, partitions int32) stack {
	streamstest.CreateTopics(t, b.Kafka, partitions, walletapp.TopicNames(ns)...)
	st := stack{log: slog.New(slog.NewTextHandler(io.Discard, nil)), src: config.Static(tree()),
		cl: streamstest.Client(t, b.Kafka, kgo.ProducerLinger(time.Millisecond))}
	st.keys, _ = token.Generate("k")
	st.in = grant.New(grant.Config{Env: streams.Env{Namespace: ns, Log: st.log}, Source: st.src, Keys: st.keys, Redis: rdb, Producer: st.cl})
	return st
}

// serve runs a wallet instance on the stack's topics, keys and config
// (o names the rest) behind an HTTP server, once its ledger serves every
// partition.
func (st stack) serve(t *testing.T, o walletapp.Options) (*walletapp.Stack, *httptest.Server) {
	t.Helper()
	o.Dir, o.Source, o.Keys, o.Producer, o.Apps, o.Users, o.Log = t.TempDir(), st.src, st.keys, st.cl, apps, users, st.log
	w, err := walletapp.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; w.Close() })
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.API.Handler())
	t.Cleanup(srv.Close)
	for w.Ledger.Serving() < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	return w, srv
}

func TestAPI(t *testing.T) {
	streamstest.EachStackOnEveryRedis(t, func(t *testing.T, b streamstest.Backend, rdb redis.UniversalClient) {
		ns := streamstest.Unique("api") + "."
		st := newStack(t, b, rdb, ns, 3)
		// As `surge wallet` builds it: grants go through a batcher.
		_, srv := st.serve(t, walletapp.Options{Kafka: b.Kafka, Namespace: ns, Redis: rdb, BatchSize: 64,
			BatchLinger: time.Millisecond, Batchers: 2, NoTotal: true})

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
		refusals(t, srv)
		conflicts(t, srv)
		stockStop(t, srv)
		redPackets(t, srv)
		identities(t, srv, b.Kafka, ns)
		batches(t, srv)
	})
}

// batches: one signed request carries many grants, each answered on its
// own and in order; an unsigned or tampered batch changes nothing.
func batches(t *testing.T, srv *httptest.Server) {
	t.Helper()
	g := func(act, rain string, amount int, extra string) string {
		return fmt.Sprintf(`{"orderNo":"%s_rain_%s_1_1","actId":"%s","activityId":"spring","sceneId":"rain","rainId":"%s","awardType":"CASH","stage":1,"amount":%d%s}`,
			act, rain, act, rain, amount, extra)
	}
	body := `{"grants":[` + strings.Join([]string{
		g("u5", "b1", 10, ""),
		g("u5", "b2", 20, ""),
		g("u1", "r1", 999, ""),            // u1's order r1 again with another amount
		g("u5", "b3", 30, `,"appId":"x"`), // another app's grant
		`{"orderNo":7}`,                   // malformed
		g("u6", "b1", 40, ""),
	}, ",") + `]}`
	for _, c := range []struct {
		name string
		sign func(*http.Request, []byte)
		want int
	}{
		{"unsigned batch", nil, 401},
		{"tampered batch", func(r *http.Request, b []byte) {
			auth.Sign(r, append([]byte(nil), b[:len(b)-1]...), appKey, time.Now())
		}, 401},
	} {
		if code, out := callWith(t, srv, "POST", "/v1/grants/batch", body, c.sign); code != c.want {
			t.Fatalf("%s: %d %v, want %d", c.name, code, out, c.want)
		}
	}
	if code, out := call(t, srv, "GET", "/v1/users/u5/balance", ""); code != 200 || out["balance"].(float64) != 0 {
		t.Fatalf("refused batches granted: %d %v", code, out)
	}
	code, out := call(t, srv, "POST", "/v1/grants/batch", body)
	if code != 200 {
		t.Fatalf("batch: %d %v", code, out)
	}
	var got []float64
	for _, r := range out["results"].([]any) {
		got = append(got, r.(map[string]any)["code"].(float64))
	}
	if want := []float64{200, 200, 409, 403, 400, 200}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batch answers %v, want %v: %v", got, want, out)
	}
	for act, want := range map[string]float64{"u5": 30, "u6": 40} {
		if code, out := call(t, srv, "GET", "/v1/users/"+act+"/balance", ""); code != 200 || out["balance"].(float64) != want {
			t.Fatalf("%s after the batch: %d %v, want %v", act, code, out, want)
		}
	}
	if code, out := call(t, srv, "POST", "/v1/grants/batch", `{"grants":[]}`); code != 400 {
		t.Fatalf("empty batch: %d %v", code, out)
	}
	protoBatches(t, srv)
}

// protoBatches: the same batch endpoint with a protobuf body (GrantBatch)
// answers GrantResults, grant by grant, under the same signature.
func protoBatches(t *testing.T, srv *httptest.Server) {
	t.Helper()
	post := func(body []byte, sign func(*http.Request, []byte)) (int, *pb.GrantResults, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/grants/batch", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/x-protobuf")
		if sign != nil {
			sign(req, body)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return resp.StatusCode, nil, string(data)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			t.Fatalf("protobuf batch answered as %q: %s", ct, data)
		}
		var out pb.GrantResults
		if err := proto.Unmarshal(data, &out); err != nil {
			t.Fatalf("answer is not GrantResults: %v", err)
		}
		return 200, &out, ""
	}
	g := func(act, rain string, amount int64, app string) *pb.RewardGrant {
		return &pb.RewardGrant{OrderNo: act + "_rain_" + rain + "_1_1", ActId: act, ActivityId: "spring", SceneId: "rain",
			RainId: rain, AwardType: pb.AwardType_CASH, Stage: 1, Amount: amount, AppId: app}
	}
	batch := func(gs ...*pb.RewardGrant) []byte {
		b, err := proto.Marshal(&pb.GrantBatch{Grants: gs})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	body := batch(g("u7", "p1", 15, ""), g("u1", "r1", 999, ""), g("u7", "p2", 50, "x"), g("u7", "p3", 25, ""))
	if code, _, out := post(body, nil); code != 401 {
		t.Fatalf("unsigned protobuf batch: %d %s", code, out)
	}
	sign := credentials(t)
	code, res, out := post(body, sign)
	if code != 200 {
		t.Fatalf("protobuf batch: %d %s", code, out)
	}
	var got []uint32
	for _, r := range res.Results {
		got = append(got, r.Code)
	}
	if want := []uint32{200, 409, 403, 200}; fmt.Sprint(got) != fmt.Sprint(want) || res.Results[1].Error == "" || res.Results[0].Activity == "" {
		t.Fatalf("protobuf batch answers %v, want %v: %v", got, want, res)
	}
	if _, res, _ := post(batch(g("u7", "p1", 15, "")), sign); len(res.GetResults()) != 1 || res.Results[0].Code != 200 || !res.Results[0].Duplicate {
		t.Fatalf("the same grant again: %v, want 200 and duplicate", res)
	}
	if code, out := call(t, srv, "GET", "/v1/users/u7/balance", ""); code != 200 || out["balance"].(float64) != 40 {
		t.Fatalf("u7 after the protobuf batches: %d %v, want 40", code, out)
	}
	for name, bad := range map[string][]byte{"not protobuf": {0xff, 0xff, 0xff}, "empty batch": batch()} {
		if code, _, out := post(bad, sign); code != 400 {
			t.Fatalf("%s: %d %s, want 400", name, code, out)
		}
	}
}

// refusals: every caller without the right credentials gets 401 or 403
// and changes nothing (u1's balance is 100 before and after).
func refusals(t *testing.T, srv *httptest.Server) {
	t.Helper()
	balance := func() float64 {
		code, out := call(t, srv, "GET", "/v1/users/u1/balance", "")
		if code != 200 {
			t.Fatalf("balance: %d %v", code, out)
		}
		return out["balance"].(float64)
	}
	before := balance()
	grant := `{"orderNo":"u1_rain_r9_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"r9","awardType":"CASH","stage":1,"amount":700}`
	bearer := func(tok string) func(*http.Request, []byte) {
		return func(r *http.Request, _ []byte) { r.Header.Set("Authorization", "Bearer "+tok) }
	}
	tokenFor := func(act string, ttl time.Duration, k auth.Key) string {
		tok, err := auth.NewUsers([]auth.Key{k}).Issue(act, ttl, time.Now().Add(-2*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	forgedKey := auth.Key{ID: userKey.ID, Secret: []byte("not-the-real-secret-at-all-00000")}
	otherApp := auth.Key{ID: "evil-1", App: "evil", Secret: []byte("0123456789abcdef0123456789abcdef")}
	none := "eyJhbGciOiJub25lIiwia2lkIjoidS0xIn0." + strings.TrimRight(base64URL(`{"sub":"u1","exp":9999999999}`), "=") + "."
	for _, c := range []struct {
		name, method, path, body string
		sign                     func(*http.Request, []byte)
		want                     int
	}{
		{"unsigned grant", "POST", "/v1/grants", grant, nil, 401},
		{"grant signed with an unknown key", "POST", "/v1/grants", grant, func(r *http.Request, b []byte) { auth.Sign(r, b, otherApp, time.Now()) }, 401},
		{"grant whose body is not what was signed", "POST", "/v1/grants", grant, func(r *http.Request, _ []byte) {
			auth.Sign(r, []byte(strings.Replace(grant, "700", "7", 1)), appKey, time.Now())
		}, 401},
		{"grant signed 10 minutes ago (a replay)", "POST", "/v1/grants", grant, func(r *http.Request, b []byte) { auth.Sign(r, b, appKey, time.Now().Add(-10*time.Minute)) }, 401},
		{"grant as another app", "POST", "/v1/grants", strings.Replace(grant, `"amount"`, `"appId":"other","amount"`, 1), credentials(t), 403},
		{"balance without a token", "GET", "/v1/users/u1/balance", "", nil, 401},
		{"balance with another user's token", "GET", "/v1/users/u1/balance", "", bearer(tokenFor("u2", 3*time.Hour, userKey)), 403},
		{"balance with an expired token", "GET", "/v1/users/u1/balance", "", bearer(tokenFor("u1", time.Hour, userKey)), 401},
		{"balance with a forged token", "GET", "/v1/users/u1/balance", "", bearer(tokenFor("u1", 3*time.Hour, forgedKey)), 401},
		{"balance with an unsigned (alg none) token", "GET", "/v1/users/u1/balance", "", bearer(none), 401},
		{"balance with garbage", "GET", "/v1/users/u1/balance", "", bearer("garbage"), 401},
		{"flow with another user's token", "GET", "/v1/users/u1/flow", "", bearer(tokenFor("u2", 3*time.Hour, userKey)), 403},
		{"withdrawal with another user's token", "POST", "/v1/users/u1/withdrawals", `{"withdraw_id":"steal","amount":100}`, bearer(tokenFor("u2", 3*time.Hour, userKey)), 403},
		{"withdrawal with a forged token", "POST", "/v1/users/u1/withdrawals", `{"withdraw_id":"steal2","amount":100}`, bearer(tokenFor("u1", 3*time.Hour, forgedKey)), 401},
		{"total without credentials", "GET", "/v1/total", "", nil, 401},
		{"identity with a user token", "GET", "/v1/identities/douyin/42", "", bearer(tokenFor("u2", 3*time.Hour, userKey)), 403},
		{"identity signed by an unknown app", "GET", "/v1/identities/douyin/42", "", func(r *http.Request, b []byte) { auth.Sign(r, b, otherApp, time.Now()) }, 401},
		{"flow page past int64", "GET", "/v1/users/u1/flow?page=99999999999999999999", "", credentials(t), 400},
		{"flow page that overflows page*size", "GET", "/v1/users/u1/flow?page=999999999999&size=100", "", credentials(t), 400},
		{"flow page negative", "GET", "/v1/users/u1/flow?page=-1", "", credentials(t), 400},
		{"flow size zero", "GET", "/v1/users/u1/flow?size=0", "", credentials(t), 400},
		{"flow size not a number", "GET", "/v1/users/u1/flow?size=ten", "", credentials(t), 400},
		{"grant of 100 KiB, signed", "POST", "/v1/grants", strings.Repeat(" ", 100<<10) + grant, credentials(t), 413},
		{"batch of 5 MiB, signed", "POST", "/v1/grants/batch", strings.Repeat(" ", 5<<20) + "{}", credentials(t), 413},
	} {
		code, out := callWith(t, srv, c.method, c.path, c.body, c.sign)
		// Every refusal is the one error body: a sentence and the code
		// that goes with the status (streams/httperr).
		if _, isText := out["error"].(string); code != c.want || !isText || out["code"] != string(httperr.ForStatus(c.want)) {
			t.Errorf("%s: %d %v, want %d with an error and code %q", c.name, code, out, c.want, httperr.ForStatus(c.want))
		}
	}
	// What the headers decide is decided before the body is read: each of
	// these announces 4 MB and sends none, and is answered anyway.
	stale := strconv.FormatInt(time.Now().Add(-10*time.Minute).Unix(), 10)
	fresh := strconv.FormatInt(time.Now().Unix(), 10)
	for name, headers := range map[string]string{
		"no signature":          "",
		"an unknown key":        "X-Surge-Key: evil-1\r\nX-Surge-Timestamp: " + fresh + "\r\nX-Surge-Signature: " + strings.Repeat("ab", 32) + "\r\n",
		"a stale timestamp":     "X-Surge-Key: " + appKey.ID + "\r\nX-Surge-Timestamp: " + stale + "\r\nX-Surge-Signature: " + strings.Repeat("ab", 32) + "\r\n",
		"a malformed signature": "X-Surge-Key: " + appKey.ID + "\r\nX-Surge-Timestamp: " + fresh + "\r\nX-Surge-Signature: xyz\r\n",
	} {
		if code := withheldBody(t, srv, headers); code != 401 {
			t.Errorf("batch with %s and its body withheld: %d, want 401 before the body", name, code)
		}
	}
	if after := balance(); after != before {
		t.Fatalf("refused callers changed u1's balance: %v -> %v", before, after)
	}
	if code, out := call(t, srv, "GET", "/v1/total", ""); code != 200 && code != 503 {
		t.Fatalf("total with a token: %d %v", code, out)
	}
	// The API's description needs no credentials: it holds no data.
	streamstest.CheckOpenAPIServed(t, srv.Config.Handler, api.OpenAPI)
}

// withheldBody sends the headers of a 4 MB batch and none of its body,
// and returns the status the server answers within 5 s (0 for none).
func withheldBody(t *testing.T, srv *httptest.Server, headers string) int {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/grants/batch HTTP/1.1\r\nHost: wallet\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\n%s\r\n", headers)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// stockStop: issuers read a coupon template's stock (GET /v1/stock/T);
// once less than 10% of it remains the wallet stops issuing it (409
// "less than 10%"), before the stock itself runs out.
func stockStop(t *testing.T, srv *httptest.Server) {
	t.Helper()
	read := func() map[string]any {
		t.Helper()
		code, out := call(t, srv, "GET", "/v1/stock/tpl-lim", "")
		if code != 200 {
			t.Fatalf("stock: %d %v", code, out)
		}
		return out
	}
	if out := read(); out["total"] != 100.0 || out["remaining"] != 95.0 || out["stop"] != false {
		t.Fatalf("fresh template: %v, want 95 of 100 sellable (5%% buffer), not stopped", out)
	}
	if code, out := call(t, srv, "GET", "/v1/stock/nope", ""); code != 404 {
		t.Fatalf("unknown template: %d %v", code, out)
	}
	if code, _ := callWith(t, srv, "GET", "/v1/stock/tpl-lim", "", nil); code != 401 {
		t.Fatalf("stock read without credentials: %d", code)
	}
	grant := func(i int) (int, map[string]any) {
		return call(t, srv, "POST", "/v1/grants", fmt.Sprintf(
			`{"orderNo":"s%d_limited_l1_2_1","actId":"s%d","activityId":"spring","sceneId":"limited","rainId":"l1","awardType":"COUPON","stage":1,"amount":1}`, i, i))
	}
	accepted, i := 0, 0
	for ; i < 200; i++ {
		code, out := grant(i)
		if code == 200 {
			accepted++
			continue
		}
		if code != 409 || !strings.Contains(fmt.Sprint(out["error"]), "less than 10%") {
			t.Fatalf("grant %d: %d %v, want 409 with the 10%% stop", i, code, out)
		}
		break
	}
	// One instance counts its own takes down: it stops exactly when 9 of
	// 100 are left.
	if accepted != 86 {
		t.Fatalf("%d coupons issued before the stop, want 86 (then 9 of 100 are left)", accepted)
	}
	time.Sleep(2 * stock.StopCheckEvery) // read again: still stopped
	if code, out := grant(i + 1); code != 409 {
		t.Fatalf("grant after the stop: %d %v", code, out)
	}
	if out := read(); out["stop"] != true || out["remaining"].(float64) >= 10 || out["remaining"].(float64) != float64(95-accepted) {
		t.Fatalf("after %d coupons: %v, want stop with %d remaining", accepted, out, 95-accepted)
	}
}

// redPackets: a person-to-person red packet moves money from the sender
// (debit booked like a withdrawal, after the sender's unbooked tokens) to
// the receiver (credited once through wallet.packets); both flows show it
// as P2P_PACKET. A repeated packet id moves nothing more; a packet over
// the balance is refused and credits nobody; one to oneself is a bad
// request; another user's token is refused.
func redPackets(t *testing.T, srv *httptest.Server) {
	t.Helper()
	if code, out := call(t, srv, "POST", "/v1/grants", `{"orderNo":"pa_rain_p1_1_1","actId":"pa","activityId":"spring","sceneId":"rain","rainId":"p1","awardType":"CASH","stage":1,"amount":500}`); code != 200 {
		t.Fatalf("grant: %d %v", code, out)
	}
	send := func(from, body string) (int, map[string]any) {
		t.Helper()
		return call(t, srv, "POST", "/v1/users/"+from+"/packets", body)
	}
	balance := func(act string, want float64) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, out := call(t, srv, "GET", "/v1/users/"+act+"/balance", "")
			if out["balance"] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: balance %v, want %v", act, out["balance"], want)
			}
		}
	}
	if code, out := send("pa", `{"packet_id":"pk1","to":"pb","amount":200}`); code != 200 || out["balance_after"] != 300.0 || out["packet_id"] != "pk1" {
		t.Fatalf("packet pa->pb: %d %v", code, out)
	}
	balance("pb", 200)
	if code, out := send("pa", `{"packet_id":"pk1","to":"pb","amount":200}`); code != 200 || out["balance_after"] != 300.0 {
		t.Fatalf("packet repeated: %d %v", code, out)
	}
	if code, out := send("pa", `{"packet_id":"pk2","to":"pb","amount":1000}`); code != 409 || !strings.Contains(fmt.Sprint(out["error"]), "over balance") {
		t.Fatalf("packet over the balance: %d %v", code, out)
	}
	if code, out := send("pa", `{"packet_id":"pk3","to":"pa","amount":1}`); code != 400 {
		t.Fatalf("packet to oneself: %d %v", code, out)
	}
	if code, out := send("pb", `{"packet_id":"pk4","to":"pc","amount":150}`); code != 200 || out["balance_after"] != 50.0 {
		t.Fatalf("packet pb->pc: %d %v", code, out)
	}
	balance("pc", 150)
	time.Sleep(300 * time.Millisecond) // a second credit of pk1 would have landed
	balance("pb", 50)
	balance("pa", 300)
	code, _ := callWith(t, srv, "POST", "/v1/users/pb/packets", `{"packet_id":"pk5","to":"pa","amount":10}`, func(req *http.Request, _ []byte) {
		tok, _ := users.Issue("pa", time.Hour, time.Now())
		req.Header.Set("Authorization", "Bearer "+tok)
	})
	if code != 403 {
		t.Fatalf("pa's token on pb's packets: %d, want 403", code)
	}
	flow := func(act string) string {
		t.Helper()
		_, out := call(t, srv, "GET", "/v1/users/"+act+"/flow?page=0&size=10", "")
		var lines []string
		for _, it := range out["items"].([]any) {
			m := it.(map[string]any)
			lines = append(lines, fmt.Sprintf("%v %v", m["kind"], m["amount"]))
		}
		return strings.Join(lines, ", ")
	}
	if got := flow("pb"); got != "P2P_PACKET -150, P2P_PACKET 200" {
		t.Fatalf("pb's flow: %s", got)
	}
	if got := flow("pa"); !strings.Contains(got, "P2P_PACKET -200") || !strings.Contains(got, "GRANT 500") {
		t.Fatalf("pa's flow: %s", got)
	}
}

// identities: the unified account. An app account the account system
// published resolves to its actID, phone first; an unknown one is 404.
func identities(t *testing.T, srv *httptest.Server, kc streams.Cluster, ns string) {
	t.Helper()
	r, err := identity.Link(ns, &pb.IdentityLink{App: "douyin", UserId: "42", Phone: "+8613700000000"})
	if err != nil {
		t.Fatal(err)
	}
	streamstest.ProduceSync(t, streamstest.Client(t, kc), r)
	want := identity.ActID("+8613700000000", "", "")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, out := call(t, srv, "GET", "/v1/identities/douyin/42", "")
		if code == 200 && out["act_id"] == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("identity of douyin:42: %d %v, want %s", code, out, want)
		}
	}
	if code, out := call(t, srv, "GET", "/v1/identities/douyin/43", ""); code != 404 {
		t.Fatalf("unknown app account: %d %v", code, out)
	}
	if code, _ := callWith(t, srv, "GET", "/v1/identities/douyin/42", "", nil); code != 401 {
		t.Fatalf("identity without credentials: %d", code)
	}
}

func base64URL(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }

// conflicts: an order number repeated with the same grant is a
// duplicate; with a different one it is refused with 409, for a cash
// grant (claimed by its token) and a coupon (claimed by key).
func conflicts(t *testing.T, srv *httptest.Server) {
	t.Helper()
	cash := `{"orderNo":"u1_rain_r1_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"r1","awardType":"CASH","stage":1,"amount":300}`
	coupon := `{"orderNo":"u3_coupon_c1_2_1","actId":"u3","activityId":"spring","sceneId":"coupon","rainId":"c1","awardType":"COUPON","stage":1,"amount":1}`
	if code, out := call(t, srv, "POST", "/v1/grants", coupon); code != 200 || out["duplicate"] != false {
		t.Fatalf("coupon: %d %v", code, out)
	}
	for _, c := range []struct {
		name, body string
		want       int
	}{
		{"cash repeated", cash, 200},
		{"cash, other amount", strings.Replace(cash, `"amount":300`, `"amount":301`, 1), 409},
		{"coupon repeated", coupon, 200},
		{"coupon, other amount", strings.Replace(coupon, `"amount":1`, `"amount":2`, 1), 409},
	} {
		code, out := call(t, srv, "POST", "/v1/grants", c.body)
		if code != c.want {
			t.Errorf("%s: %d %v, want %d", c.name, code, out, c.want)
		}
		if c.want == 200 && out["duplicate"] != true {
			t.Errorf("%s: %v, want a duplicate", c.name, out)
		}
		if c.want == 409 && !strings.Contains(fmt.Sprint(out["error"]), "order number reused") {
			t.Errorf("%s: %v, want a clear error", c.name, out)
		}
	}
}

// TestReadsGoToThePartitionOwner runs two instances, each a ledger behind
// its own API. Every user's balance read through either API is what the
// user's owner booked: a read of a user the other instance owns is sent
// on to it (the non-owner's store has that user only as of its start, if
// at all). A read already sent on once is refused by a non-owner, never
// sent on again.
func TestReadsGoToThePartitionOwner(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ns := streamstest.Unique("owner") + "."
		st := newStack(t, b, rdb, ns, 6)
		log, keys, src, cl, in := st.log, st.keys, st.src, st.cl, st.in
		type instance struct {
			led *ledger.Ledger
			api *api.Server
			srv *httptest.Server
		}
		start := func(name string) instance {
			var handler atomic.Value
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handler.Load().(http.Handler).ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			env := streams.Env{Kafka: b.Kafka, Namespace: ns, Log: log}
			led := ledger.New(ledger.Config{Env: env, Dir: t.TempDir(), Source: src, Keys: keys, Tokens: in.Tokens(),
				Advertise: srv.URL})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- led.Run(ctx, streams.InstanceID(name)) }()
			t.Cleanup(func() { cancel(); <-done })
			s := api.New(api.Config{Env: env, Intake: in, Ledger: led, Producer: cl, Redis: rdb, Source: src, Advertise: srv.URL,
				Apps: apps, Users: users})
			handler.Store(s.Handler())
			return instance{led, s, srv}
		}
		ctx := context.Background()
		granted := map[string]float64{}
		grantRound := func(round string) {
			for i := range 120 {
				act := fmt.Sprintf("u%d", i%24)
				g := &pb.RewardGrant{OrderNo: fmt.Sprintf("%s_rain_%s%d_1_1", act, round, i), ActId: act, ActivityId: "spring", SceneId: "rain",
					RainId: fmt.Sprintf("%s%d", round, i), AwardType: pb.AwardType_CASH, Stage: 1, Amount: int64(1 + i%9), AppId: "app"}
				if _, err := in.Grant(ctx, g); err != nil {
					t.Fatal(err)
				}
				granted[act] += float64(g.Amount)
			}
		}
		a := start("a")
		grantRound("one")
		bi := start("b")
		// Both instances serve a share of the six partitions, settled: the
		// group joins in more than one round.
		deadline := time.Now().Add(60 * time.Second)
		settled := time.Now()
		for time.Since(settled) < 2*time.Second {
			if a.led.Serving() == 0 || bi.led.Serving() == 0 || a.led.Serving()+bi.led.Serving() != 6 {
				settled = time.Now()
			}
			if time.Now().After(deadline) {
				t.Fatalf("instances serve %d and %d partitions", a.led.Serving(), bi.led.Serving())
			}
			time.Sleep(20 * time.Millisecond)
		}
		grantRound("two") // booked by the owners after b's start: b's store never saw a's share
		deadline = time.Now().Add(60 * time.Second)
		for a.led.Bookings.Load()+bi.led.Bookings.Load() < 240 {
			if time.Now().After(deadline) {
				t.Fatalf("%d of 240 booked", a.led.Bookings.Load()+bi.led.Bookings.Load())
			}
			time.Sleep(20 * time.Millisecond)
		}
		for act, want := range granted {
			for _, via := range []instance{a, bi} {
				var code int
				var out map[string]any
				for range 50 { // a rebalance may still settle: 503 means retry
					if code, out = call(t, via.srv, "GET", "/v1/users/"+act+"/balance", ""); code != http.StatusServiceUnavailable {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if code != 200 || out["balance"].(float64) != want {
					t.Fatalf("%s via %s: %d %v, granted %v", act, via.srv.URL, code, out, want)
				}
			}
			// Sent on once already: only the owner answers.
			answered := 0
			for _, via := range []instance{a, bi} {
				req, _ := http.NewRequest("GET", via.srv.URL+"/v1/users/"+act+"/balance", nil)
				credentials(t)(req, nil)
				req.Header.Set("X-Surge-Forwarded-By", "test")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					answered++
				case http.StatusServiceUnavailable:
				default:
					t.Fatalf("%s, forwarded read: status %d", act, resp.StatusCode)
				}
			}
			if answered != 1 {
				t.Fatalf("%s: %d instances answered a forwarded read; want only the owner", act, answered)
			}
		}
		if a.api.Forwarded() == 0 || bi.api.Forwarded() == 0 {
			t.Fatalf("reads sent on: a %d, b %d; each owns some users the other was asked about", a.api.Forwarded(), bi.api.Forwarded())
		}
	})
}

// openapi.yaml describes exactly the routes the API serves, with the
// error body every refusal is answered with.
func TestOpenAPIMatchesTheRoutes(t *testing.T) {
	streamstest.CheckOpenAPI(t, api.OpenAPI, api.Routes())
}
