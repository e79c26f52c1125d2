package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"surge/processors/wallet/auth"
	wstack "surge/processors/wallet/stack"
	"surge/streams"
	"surge/streams/streamstest"
)

// redisServer is a redis-server of the test's own, which it may kill and
// start again empty (the shared one serves other tests).
type redisServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
}

func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server on this machine (scripts/redis.sh installs it)")
	}
	r := &redisServer{t: t, port: freeLowPort(t), dir: t.TempDir()}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", r.dir)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", r.addr()); err == nil {
			c.Close()
			return
		}
		if i > 100 {
			r.t.Fatal("redis-server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill is kill -9: no save, and the data is gone (no persistence).
func (r *redisServer) kill() {
	if r.cmd != nil && r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// freeLowPort is a free port below the ephemeral range, where an
// outgoing connection cannot take it between a restart's stop and start.
func freeLowPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(10000)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free port between 20000 and 30000")
	return 0
}

// The disaster drill for the wallet: `surge wallet` runs a campaign whose
// demand is three times its phase budget and its coupon stock, and at half
// the budget its redis-server is killed and started again empty. The
// wallet notices the missing counters, answers 503 while it rebuilds them
// from the topics, and goes on: the budget and the sellable stock are met,
// not passed; every accepted cash grant is in its user's balance once.
func TestWalletRedisLossDrill(t *testing.T) {
	// Not parallel: it loads both cores for a while, and the kill -9 tests
	// beside it count on answers within their clients' timeouts.
	b := streamstest.RealBroker(t)
	const (
		budget     = 40_000
		cashEach   = 100
		cashDemand = 3 * budget / cashEach
		stock      = 300
		sellable   = stock - stock*5/100
		users      = 40
	)
	rs := startRedisServer(t)
	ns := streamstest.Unique("drill") + "."
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl := streamstest.Client(t, b.Kafka)
	if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, wstack.Topics(ns)...); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	tree := fmt.Sprintf(`activities:
  - id: spring
    children:
      - {id: spring-live, phase: official, start: %s, end: %s, budget: %d}
    scenes:
      - {id: rain, award: cash, max_amount: 1000}
      - {id: coupon, award: coupon, max_amount: 1, template: t1, stock: %d, switches: {stock_control: true}}
`, now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339), budget, stock)
	cfgFile := filepath.Join(t.TempDir(), "tree.yaml")
	if err := os.WriteFile(cfgFile, []byte(tree), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	app := auth.Key{ID: "rain-1", App: "rain", Secret: []byte(strings.Repeat("k", 32))}
	user := auth.Key{ID: "u-1", Secret: []byte(strings.Repeat("u", 32))}
	enc := base64.RawURLEncoding.EncodeToString
	env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_REDIS_ADDR=" + rs.addr(),
		"SURGE_WALLET_NAMESPACE=" + ns, "SURGE_WALLET_HTTP_ADDR=" + addr, "SURGE_WALLET_CONFIG=" + cfgFile,
		"SURGE_WALLET_REBUILD_SETTLE=1s", "SURGE_LOG_LEVEL=info", "TMPDIR=" + t.TempDir(),
		"SURGE_WALLET_KEY_SEED=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32)),
		"SURGE_WALLET_APP_KEYS=rain:rain-1:" + enc(app.Secret), "SURGE_WALLET_USER_KEYS=u-1:" + enc(user.Secret)}
	wallet := runCommand(t, env, "wallet", "wallet", "--wallet.dir="+t.TempDir())
	c := walletClient{t: t, base: "http://" + addr, app: app, users: auth.NewUsers([]auth.Key{user}), hc: &http.Client{Timeout: 5 * time.Second}}
	waitFor(t, ctx, "the wallet serving", func() bool {
		code, _, err := c.do("GET", "/v1/users/u0/balance", "", c.asUser("u0"))
		return err == nil && code == 200
	})

	var (
		mu                    sync.Mutex
		cash                  = map[string]int64{}
		cashSum, coupons      int64
		unavailable, refusals int
		lost                  sync.Once
	)
	// one sends a grant until it has a final answer: accepted (200) or
	// refused (409); anything else is retried, as a client does.
	one := func(body, act string, amount int64, isCash bool) {
		for ctx.Err() == nil {
			code, out, err := c.do("POST", "/v1/grants", body, c.asApp)
			mu.Lock()
			switch {
			case err == nil && code == 200:
				if isCash {
					cash[act] += amount
					cashSum += amount
				} else {
					coupons += amount
				}
			case err == nil && code == 409:
				refusals++
			case err == nil && code >= 500 || err != nil:
				unavailable++
			default:
				mu.Unlock()
				t.Errorf("grant %s: %d %v", body, code, out)
				return
			}
			final := err == nil && (code == 200 || code == 409)
			half := cashSum+coupons >= budget/2
			mu.Unlock()
			if half {
				lost.Do(func() {
					rs.kill()
					rs.start()
					t.Logf("redis-server killed and started again empty at %d of the %d budget", budget/2, budget)
				})
			}
			if final {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	work := make(chan func())
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				f()
			}
		}()
	}
	for i := range max(cashDemand, 3*stock) {
		act := fmt.Sprintf("u%d", i%users)
		if i < cashDemand {
			body := fmt.Sprintf(`{"orderNo":"%s_rain_r%d_1_1","actId":"%s","activityId":"spring","sceneId":"rain","rainId":"r%d","awardType":"CASH","stage":1,"amount":%d}`,
				act, i, act, i, cashEach)
			work <- func() { one(body, act, cashEach, true) }
		}
		if i < 3*stock {
			body := fmt.Sprintf(`{"orderNo":"%s_coupon_c%d_2_1","actId":"%s","activityId":"spring","sceneId":"coupon","rainId":"c%d","awardType":"COUPON","stage":1,"amount":1}`,
				act, i, act, i)
			work <- func() { one(body, act, 1, false) }
		}
	}
	close(work)
	wg.Wait()

	t.Logf("accepted %d cents cash and %d coupons of a %d budget and %d sellable coupons; %d answers unavailable (503 or no answer), %d refusals",
		cashSum, coupons, budget, sellable, unavailable, refusals)
	if cashSum+coupons > budget {
		t.Errorf("accepted %d against a budget of %d: overspent by %d", cashSum+coupons, budget, cashSum+coupons-budget)
	}
	if coupons > sellable {
		t.Errorf("issued %d coupons against %d sellable", coupons, sellable)
	}
	if cashSum+coupons <= budget-cashEach {
		t.Errorf("accepted only %d of %d: the campaign did not go on after the loss", cashSum+coupons, budget)
	}
	if unavailable == 0 {
		t.Error("no grant was held back while the counters were rebuilt")
	}
	// Every balance is what was granted: nothing lost, nothing twice.
	c.waitBalances(users, func(act string) int64 { return cash[act] })
	// On demand, every counter again from the topics: the budget stays
	// spent (a new grant is refused over it).
	out, code := runToEnd(t, env, "rebuild", "wallet", "--force")
	if code != 0 || !strings.Contains(out, "rebuilt the wallet's counters from") {
		t.Fatalf("surge rebuild wallet --force: exit %d\n%s", code, out)
	}
	t.Logf("surge rebuild wallet --force: %s", lastLine(out))
	waitFor(t, ctx, "a grant past the budget refused after the forced rebuild", func() bool {
		code, _, err := c.do("POST", "/v1/grants", `{"orderNo":"u1_rain_rx_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"rx","awardType":"CASH","stage":1,"amount":1000}`, c.asApp)
		if err == nil && code == 200 {
			t.Fatal("a grant past the budget was accepted after the forced rebuild")
		}
		return err == nil && code == 409
	})
	wallet.mu.Lock()
	log := wallet.log.String()
	wallet.mu.Unlock()
	if !strings.Contains(log, "counters rebuilt from the topics") {
		t.Errorf("the wallet never said it rebuilt its counters:\n%s", log)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
