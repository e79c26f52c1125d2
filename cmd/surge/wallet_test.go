package main

import (
	"os"
	"testing"

	"surge/processors/wallet/app"
)

// Other instances must be able to reach the advertised address: a
// wildcard listen address is advertised under this host's name.
func TestDefaultAdvertise(t *testing.T) {
	host, _ := os.Hostname()
	for listen, want := range map[string]string{
		"127.0.0.1:8480": "http://127.0.0.1:8480",
		"0.0.0.0:8480":   "http://" + host + ":8480",
		":8480":          "http://" + host + ":8480",
		"wallet-2:9000":  "http://wallet-2:9000",
	} {
		if got := defaultAdvertise(listen); got != want {
			t.Errorf("%s: advertised %s, want %s", listen, got, want)
		}
	}
}

// The wallet runs with its own GC target unless the operator set GOGC,
// which must win over the configured default.
func TestWalletGCPercent(t *testing.T) {
	noEnv := func(string) string { return "" }
	v, _, err := loadConfig("wallet", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pct, ok, err := walletGCPercent(v, noEnv); !ok || err != nil || pct != app.GCPercent {
		t.Errorf("default: %d, %v, %v; want %d, true", pct, ok, err, app.GCPercent)
	}
	v, _, err = loadConfig("wallet", []string{"--wallet.gc_percent=150"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pct, ok, err := walletGCPercent(v, noEnv); !ok || err != nil || pct != 150 {
		t.Errorf("flag: %d, %v, %v; want 150, true", pct, ok, err)
	}
	gogc := func(k string) string {
		if k == "GOGC" {
			return "100"
		}
		return ""
	}
	if _, ok, err := walletGCPercent(v, gogc); ok || err != nil {
		t.Errorf("GOGC in the environment was overridden (%v)", err)
	}
	// Nonsense is refused with a reason, and the collector is not turned
	// off without a memory limit.
	for _, bad := range []string{"0", "-5", "lots", "-1"} {
		v, _, err := loadConfig("wallet", []string{"--wallet.gc_percent=" + bad}, nil)
		if err != nil {
			continue // refused by the flag parser already
		}
		if _, ok, err := walletGCPercent(v, noEnv); ok || err == nil {
			t.Errorf("wallet.gc_percent=%s accepted", bad)
		}
	}
	v, _, err = loadConfig("wallet", []string{"--wallet.gc_percent=-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	limit := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "1GiB"
		}
		return ""
	}
	if pct, ok, err := walletGCPercent(v, limit); !ok || err != nil || pct != -1 {
		t.Errorf("-1 with GOMEMLIMIT: %d, %v, %v", pct, ok, err)
	}
}
