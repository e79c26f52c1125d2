package main

import (
	"os"
	"surge/processors/wallet/stack"
	"testing"
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
	if pct, ok := walletGCPercent(v, noEnv); !ok || pct != stack.GCPercent {
		t.Errorf("default: %d, %v; want %d, true", pct, ok, stack.GCPercent)
	}
	v, _, err = loadConfig("wallet", []string{"--wallet.gc_percent=150"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pct, ok := walletGCPercent(v, noEnv); !ok || pct != 150 {
		t.Errorf("flag: %d, %v; want 150, true", pct, ok)
	}
	gogc := func(k string) string {
		if k == "GOGC" {
			return "100"
		}
		return ""
	}
	if _, ok := walletGCPercent(v, gogc); ok {
		t.Error("GOGC in the environment was overridden")
	}
}
