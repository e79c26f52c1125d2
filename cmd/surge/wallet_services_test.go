package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"surge/processors/wallet/auth"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// walletClient calls `surge wallet` as an activity service (signed
// grants) and as its users (tokens).
type walletClient struct {
	t     *testing.T
	base  string
	app   auth.Key
	users *auth.Users
	hc    *http.Client
}

func (c walletClient) do(method, path, body string, sign func(*http.Request, []byte)) (int, map[string]any, error) {
	req, _ := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if sign != nil {
		sign(req, []byte(body))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out, nil
}

func (c walletClient) asApp(r *http.Request, body []byte) { auth.Sign(r, body, c.app, time.Now()) }

// waitBalances waits (at most 90 s) until each of users' balance, read
// through the API, is what want says, and fails the test with the first
// that never is.
func (c walletClient) waitBalances(users int, want func(act string) int64) {
	c.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for u := range users {
		act := fmt.Sprintf("u%d", u)
		for {
			code, out, err := c.do("GET", "/v1/users/"+act+"/balance", "", c.asUser(act))
			if b, ok := out["balance"].(float64); err == nil && code == 200 && ok && int64(b) == want(act) {
				break
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("%s: %d %v %v, want balance %d", act, code, out, err, want(act))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (c walletClient) asUser(act string) func(*http.Request, []byte) {
	return func(r *http.Request, _ []byte) {
		tok, _ := c.users.Issue(act, time.Hour, time.Now())
		r.Header.Set("Authorization", "Bearer "+tok)
	}
}

// `surge wallet` runs as its own process under concurrent grants,
// withdrawals and red packets between users, is killed with -9 and
// restarted; clients retry everything until they get an answer. Afterwards
// every balance, the booked ledger (wallet.ledger) and the live total
// equal the distinct grants minus the withdrawals paid, minus the packets
// sent plus those received; no order, withdrawal or packet (either side)
// is booked twice; the budget
// spent is never below what was granted; and the restarted instance
// serves reads within seconds (logged: the recovery time).
func TestWalletSurvivesKill9(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ns := streamstest.Unique("wsvc") + "."
		app := auth.Key{ID: "rain-1", App: "rain", Secret: []byte(strings.Repeat("k", 32))}
		user := auth.Key{ID: "u-1", Secret: []byte(strings.Repeat("u", 32))}
		addr := freePort(t)
		b64, enc := base64.StdEncoding.EncodeToString, base64.RawURLEncoding.EncodeToString
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_REDIS_ADDR=" + rdb.Options().Addr,
			"SURGE_WALLET_NAMESPACE=" + ns, "SURGE_WALLET_HTTP_ADDR=" + addr, "SURGE_PROCESSOR_INSTANCE_ID=" + ns + "wallet-1",
			"SURGE_WALLET_KEY_SEED=" + b64(bytes.Repeat([]byte{7}, 32)), "SURGE_WALLET_DIR=" + t.TempDir(),
			"SURGE_WALLET_APP_KEYS=rain:rain-1:" + enc(app.Secret), "SURGE_WALLET_USER_KEYS=u-1:" + enc(user.Secret)}
		wallet := runCommand(t, env, "wallet", "wallet")
		c := walletClient{t: t, base: "http://" + addr, app: app, users: auth.NewUsers([]auth.Key{user}), hc: &http.Client{Timeout: 5 * time.Second}}
		ready := func() time.Duration {
			start := time.Now()
			for {
				if code, _, err := c.do("GET", "/v1/users/u0/balance", "", c.asUser("u0")); err == nil && code == 200 {
					return time.Since(start)
				}
				if time.Since(start) > 90*time.Second {
					t.Fatal("wallet never served a read")
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		ready()
		// Credentials are checked on the deployed service too.
		if code, _, _ := c.do("GET", "/v1/users/u0/balance", "", c.asUser("u1")); code != 403 {
			t.Fatalf("another user's token: %d, want 403", code)
		}
		if code, _, _ := c.do("POST", "/v1/grants", `{}`, nil); code != 401 {
			t.Fatalf("unsigned grant: %d, want 401", code)
		}

		const users, grants = 40, 1500
		var mu sync.Mutex
		granted := map[string]int64{} // per user, distinct orders
		paid := map[string]int64{}    // per user, withdrawals answered paid
		paidIDs := map[string]bool{}
		sent, received := map[string]int64{}, map[string]int64{} // red packets answered sent
		packetIDs := map[string]bool{}
		var sum int64
		var done atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		codes := map[string]int{}
		count := func(op string, code int, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[op+" error"]++
			} else {
				codes[fmt.Sprintf("%s %d", op, code)]++
			}
		}
		began := time.Now()
		grantOne := func(i int) {
			act := fmt.Sprintf("u%d", i%users)
			amount := int64(1 + i%50)
			body := fmt.Sprintf(`{"orderNo":"%s_rain_r%d_1_1","actId":"%s","activityId":"spring","sceneId":"rain","rainId":"r%d","awardType":"CASH","stage":1,"amount":%d}`,
				act, i, act, i, amount)
			for ctx.Err() == nil {
				code, out, err := c.do("POST", "/v1/grants", body, c.asApp)
				count("grant", code, err)
				if err == nil && code == 200 {
					mu.Lock()
					granted[act] += amount
					sum += amount
					mu.Unlock()
					done.Add(1)
					return
				}
				if err == nil && code != 503 && code != 429 {
					t.Errorf("grant %d: %d %v", i, code, out)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		// moveOut withdraws or sends a red packet (op), retrying until it is
		// answered paid (then booked is called) or refused over the balance.
		moveOut := func(op, act, path, body string, booked func()) {
			for ctx.Err() == nil {
				code, out, err := c.do("POST", "/v1/users/"+act+path, body, c.asUser(act))
				count(op, code, err)
				switch {
				case err == nil && code == 200:
					mu.Lock()
					booked()
					mu.Unlock()
					return
				case err == nil && code == 409 && strings.Contains(fmt.Sprint(out["error"]), "over balance"):
					return // refused for good
				case err == nil && code != 503 && code != 202 && code != 409:
					t.Errorf("%s %s: %d %v", op, body, code, out)
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		withdrawOne := func(act, id string) {
			moveOut("withdraw", act, "/withdrawals", fmt.Sprintf(`{"withdraw_id":"%s","amount":2}`, id), func() {
				paid[act] += 2
				paidIDs[id] = true
			})
		}
		packetOne := func(from, to, id string) {
			moveOut("packet", from, "/packets", fmt.Sprintf(`{"packet_id":"%s","to":"%s","amount":3}`, id, to), func() {
				sent[from] += 3
				received[to] += 3
				packetIDs[id] = true
			})
		}
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < grants; i = int(next.Add(1)) - 1 {
					grantOne(i)
				}
			}()
		}
		const withdrawers = 4
		for w := range withdrawers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < grants/10 && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond) // something to withdraw first
				}
				for n := 0; done.Load() < grants && ctx.Err() == nil; n++ {
					act := fmt.Sprintf("u%d", (n*withdrawers+w)%users)
					withdrawOne(act, fmt.Sprintf("w%d-%d", w, n))
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		const senders = 4
		for p := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for done.Load() < grants/10 && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond)
				}
				// Through the kill, and at least 15 each.
				for n := 0; (done.Load() < grants || n < 15) && ctx.Err() == nil; n++ {
					from := (n*senders + p) % users
					packetOne(fmt.Sprintf("u%d", from), fmt.Sprintf("u%d", (from+7)%users), fmt.Sprintf("p%d-%d", p, n))
					time.Sleep(5 * time.Millisecond)
				}
			}()
		}
		for done.Load() < grants/3 {
			time.Sleep(10 * time.Millisecond)
		}
		wallet.kill()
		t.Logf("killed with -9 after %d of %d grants", done.Load(), grants)
		time.Sleep(2 * time.Second)
		wallet.start()
		recovery := ready()
		t.Logf("restarted instance served reads %s after its start (%s backend)", recovery.Round(time.Millisecond), b.Name)
		wg.Wait()
		t.Logf("traffic took %s, answers %v", time.Since(began).Round(time.Millisecond), codes)
		if t.Failed() {
			return
		}

		// Every balance, read through the API (booked plus unbooked). A
		// packet's credit is booked by the receiver's ledger after the
		// sender's debit, so a balance may take a moment to include it.
		deadline := time.Now().Add(30 * time.Second)
		for u := range users {
			act := fmt.Sprintf("u%d", u)
			want := granted[act] - paid[act] - sent[act] + received[act]
			for {
				code, out, err := c.do("GET", "/v1/users/"+act+"/balance", "", c.asUser(act))
				if err == nil && code == 200 && int64(out["balance"].(float64)) == want {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %d %v %v, want balance %d (granted %d, paid %d, packets sent %d, received %d)",
						act, code, out, err, want, granted[act], paid[act], sent[act], received[act])
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		// The booked ledger: each order and withdrawal once, sums exact.
		want := grants + len(paidIDs) + 2*len(packetIDs) // a packet: the debit and the credit
		entries := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicLedger, true, want, 60*time.Second, 2*time.Second)
		seen := map[string]bool{}
		booked := map[string]int64{}
		for _, r := range entries {
			var e pb.LedgerEntry
			if err := streams.Decode(r, &e); err != nil {
				t.Fatal(err)
			}
			if seen[e.OrderNo] {
				t.Fatalf("%s booked twice", e.OrderNo)
			}
			seen[e.OrderNo] = true
			booked[e.ActId] += e.Amount
			if e.Kind == pb.LedgerKind_WITHDRAW && !paidIDs[strings.TrimPrefix(e.OrderNo, "w:")] {
				t.Fatalf("withdrawal %s booked but answered refused", e.OrderNo)
			}
			if id := strings.TrimSuffix(strings.TrimPrefix(e.OrderNo, "p:"), ":in"); e.Kind == pb.LedgerKind_P2P_PACKET && !packetIDs[id] {
				t.Fatalf("red packet %s booked but answered refused", e.OrderNo)
			}
		}
		if len(entries) != want {
			t.Fatalf("%d ledger entries, want %d grants, %d withdrawals and %d packets twice", len(entries), grants, len(paidIDs), len(packetIDs))
		}
		for u := range users {
			act := fmt.Sprintf("u%d", u)
			if w := granted[act] - paid[act] - sent[act] + received[act]; booked[act] != w {
				t.Fatalf("%s: ledger sums to %d, want %d", act, booked[act], w)
			}
		}
		// The live total: exactly the distinct grants, after the crash.
		deadline = time.Now().Add(30 * time.Second)
		for {
			code, out, err := c.do("GET", "/v1/total", "", c.asUser("u0"))
			if err == nil && code == 200 && int64(out["total"].(float64)) == sum {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("live total %d %v %v, want %d", code, out, err, sum)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// The budget is taken before a grant is published: a crash can
		// only leave it above what was granted, never below.
		if spent, err := rdb.Get(context.Background(), ns+"wbudget:spring-live").Int64(); err != nil || spent < sum {
			t.Fatalf("budget spent %d (%v), granted %d", spent, err, sum)
		}
		t.Logf("%d grants (%d cents), %d withdrawals paid, %d red packets sent, all exact after kill -9", grants, sum, len(paidIDs), len(packetIDs))
	})
}

// A deployed wallet (wallet.require_keys, as docker-compose.yml sets it)
// refuses to start without its keys, and says which are missing, instead
// of generating throw-away ones.
func TestWalletRequiresKeys(t *testing.T) {
	cmd := exec.Command(binary(t), "wallet", "--metrics.addr=")
	cmd.Env = append(os.Environ(), "SURGE_WALLET_REQUIRE_KEYS=true", "SURGE_WALLET_APP_KEYS=rain:rain-1:"+auth.NewSecret())
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("started without keys: %s", out)
	}
	for _, want := range []string{"wallet.key_seed", "wallet.user_keys"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("error does not name %s: %s", want, out)
		}
	}
	if strings.Contains(string(out), "wallet.app_keys") {
		t.Errorf("error names wallet.app_keys, which is set: %s", out)
	}
}
