package auth

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseKeys(t *testing.T) {
	s1, s2 := NewSecret(), NewSecret()
	keys, err := ParseAppKeys("shop:shop-1:" + s1 + ", shop:shop-2:" + s2 + ",rain:rain-1:" + s1)
	if err != nil || len(keys) != 3 || keys[1].App != "shop" || keys[1].ID != "shop-2" {
		t.Fatalf("%v %v", keys, err)
	}
	for _, bad := range []string{"shop:" + s1, "shop:k:c2hvcnQ=", "shop:k:!!!", "a:k:" + s1 + ",b:k:" + s2} {
		if _, err := ParseAppKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		} else if strings.Contains(err.Error(), s1) || strings.Contains(err.Error(), s2) {
			t.Errorf("%q: the error shows the secret: %v", bad, err)
		}
	}
	if _, err := ParseUserKeys("u-1:" + s1 + ",u-2:" + s2); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseUserKeys("nocolon"); err == nil {
		t.Fatal("user key without a secret accepted")
	}
}

// Rotation: while both keys of an app are configured, requests signed with
// either verify as the app; once the old one is removed, its requests fail.
func TestAppKeyRotation(t *testing.T) {
	old, next := Key{ID: "shop-1", App: "shop", Secret: []byte(strings.Repeat("a", 32))}, Key{ID: "shop-2", App: "shop", Secret: []byte(strings.Repeat("b", 32))}
	body := []byte(`{"orderNo":"x"}`)
	req := func(k Key) *http.Request {
		r, _ := http.NewRequest("POST", "http://w/v1/grants?x=1", nil)
		Sign(r, body, k, time.Now())
		return r
	}
	both := NewApps([]Key{old, next})
	for _, k := range []Key{old, next} {
		if app, err := both.Verify(req(k), body, time.Now()); err != nil || app != "shop" {
			t.Fatalf("%s: %q %v", k.ID, app, err)
		}
	}
	if _, err := NewApps([]Key{next}).Verify(req(old), body, time.Now()); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("removed key still verifies: %v", err)
	}
	r := req(next)
	r.URL.RawQuery = "x=2" // the path and query are signed
	if _, err := both.Verify(r, body, time.Now()); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("changed query verifies: %v", err)
	}
}

func TestUserTokens(t *testing.T) {
	k1, k2 := Key{ID: "u-1", Secret: []byte(strings.Repeat("c", 32))}, Key{ID: "u-2", Secret: []byte(strings.Repeat("d", 32))}
	now := time.Now()
	old, _ := NewUsers([]Key{k1}).Issue("alice", time.Hour, now)
	u := NewUsers([]Key{k2, k1}) // rotated: k2 issues, k1 still verifies
	fresh, _ := u.Issue("bob", time.Hour, now)
	if c, err := u.Verify(old, now); err != nil || c.Sub != "alice" {
		t.Fatalf("old key's token: %v %v", c, err)
	}
	if c, err := u.Verify(fresh, now); err != nil || c.Sub != "bob" {
		t.Fatalf("new key's token: %v %v", c, err)
	}
	if _, err := u.Verify(fresh, now.Add(2*time.Hour)); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired token: %v", err)
	}
	// The claims swapped for another user's under the same signature.
	parts, other := strings.Split(fresh, "."), strings.Split(old, ".")
	if _, err := u.Verify(parts[0]+"."+other[1]+"."+parts[2], now); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("tampered claims verify: %v", err)
	}
	if _, err := NewUsers([]Key{k2}).Verify(old, now); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("token of a removed key verifies: %v", err)
	}
}
