package main

import (
	"os"
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
