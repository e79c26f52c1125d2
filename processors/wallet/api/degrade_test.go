package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	walletapp "surge/processors/wallet/app"
	"surge/processors/wallet/internal/guard"
	"surge/streams/streamstest"
)

// Every degrade switch, flipped at run time as a reload of the wallet's
// file does, turns its weak dependency off and the API shows it:
// counter (the live total answers 503), counter_primary (the total is
// read from the backup Redis), stock (stock-controlled coupons refused,
// others still granted), lock (a withdrawal no longer waits for the
// per-user lock), order_claim (keyed grants not claimed in Redis),
// global_limit (the distributed rate limit skipped). The
// token_redis switch has its own tests (ledger: TestDegradedTokenRedis).
func TestDegradeSwitches(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ns := streamstest.Unique("dg") + "."
		st := newStack(t, b, rdb, ns, 3)
		backup := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DB: 1})
		_, srv := st.serve(t, walletapp.Options{Kafka: b.Kafka, Namespace: ns, Redis: rdb, BackupRedis: backup})
		set := func(degrade map[string]bool, globalLimit int) {
			t.Helper()
			tr := tree()
			tr.Degrade, tr.RateLimits.GrantsGlobal = degrade, globalLimit
			if err := st.src.Swap(tr); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		grant := func(scene, award string, amount int) (int, map[string]any) {
			n++
			return call(t, srv, "POST", "/v1/grants", fmt.Sprintf(
				`{"orderNo":"d%d_%s_r%d_%d_1","actId":"d%d","activityId":"spring","sceneId":"%s","rainId":"r%d","awardType":"%s","stage":1,"amount":%d}`,
				n, scene, n, map[string]int{"CASH": 1, "COUPON": 2}[award], n, scene, n, award, amount))
		}
		eventually := func(what string, ok func() bool) {
			t.Helper()
			for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: not within 20 s", what)
				}
			}
		}
		total := func() (int, float64) {
			code, out := call(t, srv, "GET", "/v1/total", "")
			v, _ := out["total"].(float64)
			return code, v
		}

		// counter
		if code, out := grant("rain", "CASH", 300); code != 200 {
			t.Fatalf("grant: %d %v", code, out)
		}
		eventually("the total shows the grant", func() bool { _, v := total(); return v == 300 })
		set(map[string]bool{guard.Counter: true}, 0)
		if code, out := call(t, srv, "GET", "/v1/total", ""); code != 503 || !strings.Contains(fmt.Sprint(out["error"]), "switched off") {
			t.Fatalf("total with counter off: %d %v", code, out)
		}

		// counter_primary: a sum only the backup holds shows once reads move there.
		if err := backup.HSet(context.Background(), ns+walletapp.TotalKey, "999", 1000).Err(); err != nil {
			t.Fatal(err)
		}
		set(nil, 0)
		eventually("the total read from the primary (300, without the backup's 1000)", func() bool { _, v := total(); return v == 300 })
		set(map[string]bool{guard.CounterPrimary: true}, 0)
		eventually("the total read from the backup", func() bool { _, v := total(); return v == 1300 })

		// stock
		set(map[string]bool{guard.Stock: true}, 0)
		if code, out := grant("limited", "COUPON", 1); code != 409 || !strings.Contains(fmt.Sprint(out["error"]), "switched off") {
			t.Fatalf("stock-controlled coupon with stock off: %d %v", code, out)
		}
		if code, out := grant("coupon", "COUPON", 1); code != 200 {
			t.Fatalf("coupon without stock control, stock off: %d %v", code, out)
		}
		set(nil, 0)
		if code, out := grant("limited", "COUPON", 1); code != 200 {
			t.Fatalf("stock-controlled coupon, stock on: %d %v", code, out)
		}

		// lock: another withdrawal of d1 holds the lock.
		if err := rdb.Set(context.Background(), ns+"wlock:d1", "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if code, out := call(t, srv, "POST", "/v1/users/d1/withdrawals", `{"withdraw_id":"wd1","amount":100}`); code != 409 {
			t.Fatalf("withdrawal while locked: %d %v", code, out)
		}
		set(map[string]bool{guard.Lock: true}, 0)
		if code, out := call(t, srv, "POST", "/v1/users/d1/withdrawals", `{"withdraw_id":"wd1","amount":100}`); code != 200 {
			t.Fatalf("withdrawal with the lock off: %d %v", code, out)
		}

		// order_claim: a repeated coupon order number is a duplicate while
		// claims are on; with them off it is taken as new (its consumers
		// take an order number once), and with them back on a duplicate again.
		coupon := `{"orderNo":"oc_coupon_c9_2_1","actId":"oc","activityId":"spring","sceneId":"coupon","rainId":"c9","awardType":"COUPON","stage":1,"amount":1}`
		if code, out := call(t, srv, "POST", "/v1/grants", coupon); code != 200 || out["duplicate"] != false {
			t.Fatalf("coupon: %d %v", code, out)
		}
		if code, out := call(t, srv, "POST", "/v1/grants", coupon); code != 200 || out["duplicate"] != true {
			t.Fatalf("coupon repeated, claims on: %d %v", code, out)
		}
		set(map[string]bool{guard.OrderClaim: true}, 0)
		if code, out := call(t, srv, "POST", "/v1/grants", coupon); code != 200 || out["duplicate"] != false {
			t.Fatalf("coupon repeated, claims off: %d %v, want it taken as new", code, out)
		}
		set(nil, 0)
		if code, out := call(t, srv, "POST", "/v1/grants", coupon); code != 200 || out["duplicate"] != true {
			t.Fatalf("coupon repeated, claims on again: %d %v (the first claim must have survived)", code, out)
		}

		// global_limit: one grant a second over all instances.
		set(nil, 1)
		refused := 0
		for range 3 {
			if code, _ := grant("rain", "CASH", 1); code == 429 {
				refused++
			}
		}
		if refused == 0 {
			t.Fatal("3 grants at a global limit of 1/s: none refused")
		}
		set(map[string]bool{guard.GlobalLimit: true}, 1)
		for i := range 3 {
			if code, out := grant("rain", "CASH", 1); code != 200 {
				t.Fatalf("grant %d with global_limit off: %d %v", i, code, out)
			}
		}
	})
}
