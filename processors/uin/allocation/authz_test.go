package allocation_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"surge/platform/apikey"
	"surge/processors/uin/allocation"
	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

// TestWhoMayCallThePool: each row of docs/uin.md's authorization table.
// Only a key of uin.pool_keys opens the API; a count outside 1..1000, or
// not a number, is 400 with the reason before any uin is touched (the
// service here has no pool behind it: reaching it would fail the test).
func TestWhoMayCallThePool(t *testing.T) {
	const secret = "registration-secret-0123456789abcdef"
	keys, err := apikey.Parse("registration:" + secret)
	if err != nil {
		t.Fatal(err)
	}
	s := allocation.New(allocation.Config{Keys: keys, Env: streams.Env{Metrics: metrics.NewRegistry()}})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, c := range []struct {
		name, method, path, auth string
		want                     int
	}{
		{"allocation without a key", "POST", "/v1/uins", "", 401},
		{"allocation with an unknown key", "POST", "/v1/uins", "Bearer " + strings.Repeat("x", 40), 401},
		{"allocation with the key as Basic", "POST", "/v1/uins", "Basic " + secret, 401},
		{"pool state without a key", "GET", "/v1/pool", "", 401},
		{"the API's description without a key", "GET", "/v1/openapi.yaml", "", 200},
		{"a path not served, without a key", "GET", "/v1/nothing", "", 401},
		{"count 0", "POST", "/v1/uins?count=0", "Bearer " + secret, 400},
		{"count 1001", "POST", "/v1/uins?count=1001", "Bearer " + secret, 400},
		{"count negative", "POST", "/v1/uins?count=-1", "Bearer " + secret, 400},
		{"count past int64", "POST", "/v1/uins?count=99999999999999999999", "Bearer " + secret, 400},
		{"count not a number", "POST", "/v1/uins?count=ten", "Bearer " + secret, 400},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
	streamstest.CheckOpenAPIServed(t, s.Handler(), allocation.OpenAPI)
}
