package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// /readyz answers 503 naming every failing check until all pass; a
// removed check no longer counts, and two checks of one name both do.
func TestReadinessNamesWhatIsNotReady(t *testing.T) {
	c := &Checks{}
	joined := NewFlag("joining group g")
	removeJoined := c.Add("processor p", joined.Check)
	redisDown := errors.New("dial tcp: connection refused")
	removeRedis := c.Add("redis r", func(context.Context) error { return redisDown })
	c.Add("processor p", func(context.Context) error { return nil })
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "processor p: joining group g") || !strings.Contains(body, "redis r: dial tcp") {
		t.Fatalf("not ready: %d %q", code, body)
	}
	joined.Set(true, "")
	removeRedis()
	if code, body := get(); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("ready: %d %q", code, body)
	}
	joined.Set(false, "session failed")
	if code, _ := get(); code != http.StatusServiceUnavailable {
		t.Fatalf("after the flag dropped: %d", code)
	}
	removeJoined()
	if code, _ := get(); code != http.StatusOK {
		t.Fatalf("after the check was removed: %d", code)
	}
}
