package auth

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"
)

var (
	fuzzApp  = Key{ID: "k1", App: "app1", Secret: []byte("0123456789abcdef0123456789abcdef")}
	fuzzUser = Key{ID: "u1", Secret: []byte("fedcba9876543210fedcba9876543210")}
	fuzzNow  = time.Unix(1_800_000_000, 0)
)

// FuzzAppSignature: a signed request verifies with the body it was signed
// over and no other, whatever the method, path, headers and bodies; and
// no header of any shape panics the verifier.
func FuzzAppSignature(f *testing.F) {
	f.Add("POST", "/v1/grants", []byte(`{"orderNo":"u1_rain_r9_1_1"}`), []byte(`{"orderNo":"u1_rain_r9_1_2"}`), "", "", "")
	f.Add("POST", "/v1/grants/batch?x=1", []byte{}, []byte{0}, "k1", "1800000000", strings.Repeat("0", 64))
	f.Add("GET", "/v1/identities/a/b", []byte(nil), []byte(nil), "k1", "-9223372036854775808", "zz")
	apps := NewApps([]Key{fuzzApp})
	f.Fuzz(func(t *testing.T, method, uri string, signed, sent []byte, keyID, ts, sig string) {
		req, err := http.NewRequest(method, "http://wallet"+uri, nil)
		if err != nil || req.URL.RequestURI() == "" {
			return
		}
		Sign(req, signed, fuzzApp, fuzzNow)
		app, err := apps.Verify(req, sent, fuzzNow)
		if ok := err == nil; ok != bytes.Equal(signed, sent) {
			t.Fatalf("signed %q, sent %q: verified %v (%v)", signed, sent, ok, err)
		}
		if err == nil && app != fuzzApp.App {
			t.Fatalf("verified as %q", app)
		}
		// Headers of any shape: refused without a panic, never accepted
		// unless they are the real signature's.
		forged := req.Clone(req.Context())
		forged.Header.Set(HeaderKey, keyID)
		forged.Header.Set(HeaderTimestamp, ts)
		forged.Header.Set(HeaderSignature, sig)
		if _, err := apps.Verify(forged, sent, fuzzNow); err == nil &&
			(sig != req.Header.Get(HeaderSignature) && !strings.EqualFold(sig, req.Header.Get(HeaderSignature)) || !bytes.Equal(signed, sent)) {
			t.Fatalf("forged headers %q %q %q verified", keyID, ts, sig)
		}
	})
}

// FuzzUserToken: no token verifies unless its header and claims are ones
// this key signed, and no string of any shape panics the verifier.
func FuzzUserToken(f *testing.F) {
	users := NewUsers([]Key{fuzzUser})
	good, err := users.Issue("u1", time.Hour, fuzzNow)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add("eyJhbGciOiJub25lIiwia2lkIjoidTEifQ.eyJzdWIiOiJ1MSIsImV4cCI6OTk5OTk5OTk5OX0.")
	f.Add("a.b.c")
	f.Add("")
	signedPart := good[:strings.LastIndexByte(good, '.')]
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := users.Verify(tok, fuzzNow)
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(tok, '.'); i < 0 || tok[:i] != signedPart {
			t.Fatalf("%q verified (%+v) but its header and claims are not what was signed", tok, c)
		}
		if c.Sub != "u1" {
			t.Fatalf("verified subject %q", c.Sub)
		}
	})
}
