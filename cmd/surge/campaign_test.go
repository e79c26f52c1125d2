package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	walletapp "surge/processors/wallet/app"
	"surge/processors/wallet/auth"
	"surge/streams"
	"surge/streams/streamstest"
)

// walletCampaign is a wallet process on a broker and a Redis of the
// test's, running one campaign: a cash budget and a coupon stock, and
// clients granting three times what either allows, retrying each grant
// to its final answer (200 or 409) as an activity service does.
type walletCampaign struct {
	t       *testing.T
	env     []string
	dir     string
	wallet  *service
	c       walletClient
	ns      string
	dataDir string

	mu                    sync.Mutex
	cash                  map[string]int64
	cashSum, coupons      int64
	unavailable, refusals int

	// The campaign holds its callers once holdAt is accepted, until
	// resume is closed: the drill's loss then lands with most of the
	// campaign still to come, however fast the wallet is (a campaign that
	// had finished before the loss would leave nothing to hold back).
	holdAt int64
	resume chan struct{}
}

// holdAfter makes the campaign wait, once n is accepted, for Resume.
func (w *walletCampaign) holdAfter(n int64) {
	w.holdAt, w.resume = n, make(chan struct{})
}

// Resume lets a held campaign go on.
func (w *walletCampaign) Resume() { close(w.resume) }

// held waits for Resume once holdAt is accepted.
func (w *walletCampaign) held(ctx context.Context) {
	if w.resume == nil || w.accepted() < w.holdAt {
		return
	}
	select {
	case <-w.resume:
	case <-ctx.Done():
	}
}

const (
	campaignBudget   = 40_000
	campaignCashEach = 100
	campaignStock    = 300
	campaignSellable = campaignStock - campaignStock*5/100 // 5% kept back
	campaignUsers    = 40
)

// startWalletCampaign starts `surge run wallet` on the redis at
// redisAddr with the campaign's tree and waits until it serves.
func startWalletCampaign(t *testing.T, ctx context.Context, b streamstest.Backend, redisAddr string) *walletCampaign {
	t.Helper()
	ns := streamstest.Unique("campaign") + "."
	cl := streamstest.Client(t, b.Kafka)
	if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, walletapp.Topics(ns)...); err != nil {
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
`, now.Add(-time.Hour).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339), campaignBudget, campaignStock)
	cfgFile := filepath.Join(t.TempDir(), "tree.yaml")
	if err := os.WriteFile(cfgFile, []byte(tree), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	app := auth.Key{ID: "rain-1", App: "rain", Secret: []byte(strings.Repeat("k", 32))}
	user := auth.Key{ID: "u-1", Secret: []byte(strings.Repeat("u", 32))}
	enc := base64.RawURLEncoding.EncodeToString
	w := &walletCampaign{t: t, ns: ns, cash: map[string]int64{}, dataDir: t.TempDir(),
		env: []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_REDIS_ADDR=" + redisAddr,
			"SURGE_WALLET_NAMESPACE=" + ns, "SURGE_WALLET_HTTP_ADDR=" + addr, "SURGE_WALLET_CONFIG=" + cfgFile,
			"SURGE_WALLET_REBUILD_SETTLE=1s", "SURGE_LOG_LEVEL=info", "TMPDIR=" + t.TempDir(),
			"SURGE_WALLET_KEY_SEED=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32)),
			"SURGE_WALLET_APP_KEYS=rain:rain-1:" + enc(app.Secret), "SURGE_WALLET_USER_KEYS=u-1:" + enc(user.Secret)}}
	w.wallet = runCommand(t, w.env, "wallet", "run", "wallet", "--wallet.dir="+w.dataDir)
	w.c = walletClient{t: t, base: "http://" + addr, app: app, users: auth.NewUsers([]auth.Key{user}), hc: &http.Client{Timeout: 5 * time.Second}}
	waitFor(t, ctx, "the wallet serving", func() bool {
		code, _, err := w.c.do("GET", "/v1/users/u0/balance", "", w.c.asUser("u0"))
		return err == nil && code == 200
	})
	return w
}

// accepted is the cash and coupons accepted so far.
func (w *walletCampaign) accepted() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cashSum + w.coupons
}

// run grants until every grant has its final answer, 8 callers at once.
func (w *walletCampaign) run(ctx context.Context) {
	one := func(body, act string, amount int64, isCash bool) {
		for ctx.Err() == nil {
			w.held(ctx)
			code, out, err := w.c.do("POST", "/v1/grants", body, w.c.asApp)
			w.mu.Lock()
			switch {
			case err == nil && code == 200:
				if isCash {
					w.cash[act] += amount
					w.cashSum += amount
				} else {
					w.coupons += amount
				}
			case err == nil && code == 409:
				w.refusals++
			case err == nil && code >= 500 || err != nil:
				w.unavailable++
			default:
				w.mu.Unlock()
				w.t.Errorf("grant %s: %d %v", body, code, out)
				return
			}
			w.mu.Unlock()
			if err == nil && (code == 200 || code == 409) {
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
	cashDemand := 3 * campaignBudget / campaignCashEach
	for i := range max(cashDemand, 3*campaignStock) {
		act := fmt.Sprintf("u%d", i%campaignUsers)
		if i < cashDemand {
			body := fmt.Sprintf(`{"orderNo":"%s_rain_r%d_1_1","actId":"%s","activityId":"spring","sceneId":"rain","rainId":"r%d","awardType":"CASH","stage":1,"amount":%d}`,
				act, i, act, i, campaignCashEach)
			work <- func() { one(body, act, campaignCashEach, true) }
		}
		if i < 3*campaignStock {
			body := fmt.Sprintf(`{"orderNo":"%s_coupon_c%d_2_1","actId":"%s","activityId":"spring","sceneId":"coupon","rainId":"c%d","awardType":"COUPON","stage":1,"amount":1}`,
				act, i, act, i)
			work <- func() { one(body, act, 1, false) }
		}
	}
	close(work)
	wg.Wait()
}

// check asserts the campaign's outcome after a loss: the budget and the
// sellable stock never passed, the campaign went on after the loss (and
// was held back while the counters were rebuilt), every balance exactly
// what was granted; then `surge rebuild wallet --force` rebuilds every
// counter again from the topics and the budget stays spent.
func (w *walletCampaign) check(ctx context.Context) {
	t := w.t
	t.Helper()
	w.mu.Lock()
	cashSum, coupons := w.cashSum, w.coupons
	t.Logf("wallet: accepted %d cents cash and %d coupons of a %d budget and %d sellable coupons; %d answers unavailable (503 or no answer), %d refusals",
		cashSum, coupons, campaignBudget, campaignSellable, w.unavailable, w.refusals)
	if cashSum+coupons > campaignBudget {
		t.Errorf("accepted %d against a budget of %d: overspent by %d", cashSum+coupons, campaignBudget, cashSum+coupons-campaignBudget)
	}
	if coupons > campaignSellable {
		t.Errorf("issued %d coupons against %d sellable", coupons, campaignSellable)
	}
	if cashSum+coupons <= campaignBudget-campaignCashEach {
		t.Errorf("accepted only %d of %d: the campaign did not go on after the loss", cashSum+coupons, campaignBudget)
	}
	if w.unavailable == 0 {
		t.Error("no grant was held back while the counters were rebuilt")
	}
	w.mu.Unlock()
	// Every balance is what was granted: nothing lost, nothing twice.
	w.c.waitBalances(campaignUsers, func(act string) int64 {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.cash[act]
	})
	out, code := runToEnd(t, w.env, "rebuild", "wallet", "--force")
	if code != 0 || !strings.Contains(out, "rebuilt the wallet's counters from") {
		t.Fatalf("surge rebuild wallet --force: exit %d\n%s", code, out)
	}
	t.Logf("surge rebuild wallet --force: %s", lastLine(out))
	waitFor(t, ctx, "a grant past the budget refused after the forced rebuild", func() bool {
		code, _, err := w.c.do("POST", "/v1/grants", `{"orderNo":"u1_rain_rx_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"rx","awardType":"CASH","stage":1,"amount":1000}`, w.c.asApp)
		if err == nil && code == 200 {
			t.Fatal("a grant past the budget was accepted after the forced rebuild")
		}
		return err == nil && code == 409
	})
	w.wallet.mu.Lock()
	log := w.wallet.log.String()
	w.wallet.mu.Unlock()
	if !strings.Contains(log, "counters rebuilt from the topics") {
		t.Errorf("the wallet never said it rebuilt its counters:\n%s", log)
	}
}
