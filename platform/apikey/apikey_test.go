package apikey

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"surge/streams/httperr"
	"testing"
)

func TestParseRefusesWeakAndMalformed(t *testing.T) {
	long := strings.Repeat("a", 32)
	for _, spec := range []string{"", " , ", "reg", "reg:short", ":" + long, "a:" + long + ",a:" + strings.Repeat("b", 32)} {
		if _, err := Parse(spec); err == nil {
			t.Errorf("Parse(%q) accepted", spec)
		} else if strings.Contains(err.Error(), long) {
			t.Errorf("error shows the secret: %v", err)
		}
	}
	k, err := Parse("reg:" + long + ", old:" + strings.Repeat("c", 40))
	if err != nil {
		t.Fatal(err)
	}
	if name, ok := k.Caller(strings.Repeat("c", 40)); !ok || name != "old" {
		t.Fatalf("rotated key: %q %v", name, ok)
	}
}

func TestRequire(t *testing.T) {
	k, secret := Generate("reg")
	h := k.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(CallerOf(r.Context())))
	}))
	for _, c := range []struct {
		auth string
		code int
		body string
	}{
		{"", 401, ""}, {"Bearer ", 401, ""}, {"Basic " + secret, 401, ""},
		{"Bearer " + secret + "x", 401, ""}, {"Bearer " + secret, 200, "reg"},
		{"bearer " + secret, 200, "reg"}, {"BEARER " + secret, 200, "reg"}, // the scheme is case-insensitive
	} {
		req := httptest.NewRequest("POST", "/", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.code || (c.body != "" && rec.Body.String() != c.body) {
			t.Errorf("auth %q: %d %q, want %d %q", c.auth, rec.Code, rec.Body.String(), c.code, c.body)
		}
		var refusal httperr.Body
		if c.code == 401 && (rec.Header().Get("Content-Type") != "application/json" || json.Unmarshal(rec.Body.Bytes(), &refusal) != nil ||
			refusal.Code != httperr.Unauthorized || refusal.Error == "") {
			t.Errorf("auth %q: refused with %q %q, want the JSON error body, code unauthorized", c.auth, rec.Header().Get("Content-Type"), rec.Body.String())
		}
	}
}
