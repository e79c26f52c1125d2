package apikey

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzRequire: a request reaches the handler only with "Bearer " and a
// configured secret, whatever else its Authorization header holds, and
// the handler then knows the caller by name.
func FuzzRequire(f *testing.F) {
	const secret = "0123456789abcdef0123456789abcdef"
	keys, err := Parse("ops:" + secret)
	if err != nil {
		f.Fatal(err)
	}
	for _, h := range []string{"Bearer " + secret, "bearer " + secret, "Bearer " + secret + " ", "Bearer", "Basic b3BzOg==", "", "Bearer \x00"} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, header string) {
		reached := ""
		h := keys.Require(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { reached = CallerOf(r.Context()) }))
		req := httptest.NewRequest("GET", "/v1/pool", nil)
		req.Header["Authorization"] = []string{header}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		// The scheme's name in any case (RFC 9110), then the secret exactly.
		want := len(header) == 7+len(secret) && strings.EqualFold(header[:7], "Bearer ") && header[7:] == secret
		if (reached != "") != want || (want && reached != "ops") {
			t.Fatalf("Authorization %q: reached as %q (code %d)", header, reached, w.Code)
		}
		if reached == "" && w.Code != http.StatusUnauthorized {
			t.Fatalf("Authorization %q refused with %d", header, w.Code)
		}
	})
}
