package recon_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"surge/platform/apikey"
	"surge/sinks/clickhouse"
	"surge/sinks/recon"
)

// sqlRecorder is a store that answers every query with one result row
// and keeps the SQL it was sent.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []string
}

func (s *sqlRecorder) Exec(context.Context, string) error { return errors.New("read-only") }
func (s *sqlRecorder) Insert(context.Context, string, []clickhouse.Column, *clickhouse.RowWriter) error {
	return errors.New("read-only")
}
func (s *sqlRecorder) Close() error { return nil }
func (s *sqlRecorder) QueryStrings(_ context.Context, sql string) ([][]string, error) {
	s.mu.Lock()
	s.sql = append(s.sql, sql)
	s.mu.Unlock()
	if strings.Contains(sql, "FROM recon_results") {
		return [][]string{{"h1", "5", "4", "1", "1"}}, nil
	}
	return nil, nil
}

// literals splits ClickHouse SQL into its string literals (decoded) and
// the rest, with each literal replaced by '?'.
func literals(sql string) (lits []string, rest string, ok bool) {
	var b, lit strings.Builder
	in := false
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		switch {
		case !in && c == '\'':
			in = true
			lit.Reset()
		case !in:
			b.WriteByte(c)
		case c == '\\':
			if i+1 == len(sql) {
				return nil, "", false
			}
			i++
			lit.WriteByte(sql[i])
		case c == '\'' && i+1 < len(sql) && sql[i+1] == '\'':
			i++
			lit.WriteByte('\'')
		case c == '\'':
			in = false
			lits = append(lits, lit.String())
			b.WriteByte('?')
		default:
			lit.WriteByte(c)
		}
	}
	return lits, b.String(), !in
}

// The operators' page takes its drill-down's parameters from the address
// bar: whatever they are, it answers 200, 400 or 404 (never 5xx, never a
// panic), every value reaches the SQL only inside a string literal that
// decodes back to it (no injection), and the ?key= redirect never leaves
// the site.
func FuzzDashboardParams(f *testing.F) {
	f.Add("granted_vs_booked", "1763632800000", "activity=a scene=s", "/mismatch")
	f.Add("granted_vs_booked", "1", "user=u' OR 1=1 --", "//evil.example")
	f.Add("tokens_vs_ledger", "-5", `activity=\' scene=x\`, "/\\evil")
	f.Add("nope", "x", "", "/")
	secret := strings.Repeat("k", 40)
	keys, err := apikey.Parse("ops:" + secret)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, check, hour, scope, path string) {
		store := &sqlRecorder{}
		d := &recon.Dashboard{Store: store, Keys: keys, Now: func() time.Time { return time.UnixMilli(1763632800000) },
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		h := d.Handler()
		q := url.Values{"check": {check}, "hour": {hour}, "scope": {scope}}
		r := httptest.NewRequest(http.MethodGet, "/mismatch?"+q.Encode(), nil)
		r.Header.Set("Authorization", "Bearer "+secret)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound:
		default:
			t.Fatalf("GET /mismatch?%s: %d", q.Encode(), w.Code)
		}
		// The parameters, and the fields read out of the scope (a field
		// the scope lacks is the empty literal).
		allowed := map[string]bool{check: true, scope: true, strings.TrimPrefix(scope, "user="): true, "": true}
		for _, f := range strings.Fields(scope) {
			if _, v, ok := strings.Cut(f, "="); ok {
				allowed[v] = true
			}
		}
		for _, sql := range store.sql {
			lits, rest, ok := literals(sql)
			if !ok {
				t.Fatalf("unterminated literal in %q", sql)
			}
			for _, l := range lits {
				if !allowed[l] {
					t.Fatalf("literal %q in the SQL is none of the parameters (check %q, scope %q):\n%s", l, check, scope, sql)
				}
			}
			if strings.ContainsAny(rest, ";") || strings.Contains(rest, "--") || strings.Contains(rest, "/*") {
				t.Fatalf("the parameters reached the SQL outside a literal:\n%s", sql)
			}
		}

		// ?key= sets the cookie and redirects within the site.
		u := &url.URL{Path: path, RawQuery: url.Values{"key": {secret}, "x": {scope}}.Encode()}
		r = httptest.NewRequest(http.MethodGet, "/", nil)
		r.URL = u
		r.RequestURI = u.RequestURI()
		w = httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if loc := w.Header().Get("Location"); w.Code == http.StatusSeeOther {
			if !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") || strings.HasPrefix(loc, "/\\") {
				t.Fatalf("?key= on %q redirects to %q, off the site", path, loc)
			}
			if strings.Contains(loc, secret) {
				t.Fatalf("the redirect %q keeps the key in the address", loc)
			}
		}
	})
}
