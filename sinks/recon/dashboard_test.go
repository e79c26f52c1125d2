package recon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/platform/apikey"
	"surge/sinks/recon"
	"surge/streams"
	"surge/streams/embedded"
)

// dashboardHour is a day no other test writes facts for.
var dashboardHour = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// seedDashboard writes an hour of cash grants in activity dash-act where
// user dash-u7's order never booked, reconciles the hour (a mismatch), and
// adds a dead letter; it returns the operators' page over them.
func seedDashboard(t *testing.T, admin ...*kadm.Client) (*httptest.Server, string) {
	t.Helper()
	at := dashboardHour.UnixMilli() + 1000
	var grants, tokens, ledger []string
	for i := range 20 {
		no := fmt.Sprintf("dash-u%d_rain_%d_1_1", i, i)
		grants = append(grants, fmt.Sprintf("('%s', 'dash-u%d', 'dash-act', 'dash', 'rain', 'CASH', 100, %d)", no, i, at+int64(i)))
		tokens = append(tokens, fmt.Sprintf("('%s', 'dash-u%d', 'dash-act', 'rain', 100, 'PROCESSING', %d)", no, i, at+int64(i)))
		if i != 7 { // dash-u7's booking is lost
			ledger = append(ledger, fmt.Sprintf("('%s', 'dash-u%d', 'GRANT', 100, 'dash-act', 'rain', 0, %d, %d)", no, i, at+5000, at+int64(i)))
		}
	}
	exec(t, "INSERT INTO grants (order_no, act_id, activity_id, parent_activity_id, scene_id, award_type, amount, at_ms) VALUES "+strings.Join(grants, ","))
	exec(t, "INSERT INTO tokens (order_no, act_id, activity_id, scene_id, amount, status, open_time) VALUES "+strings.Join(tokens, ","))
	exec(t, "INSERT INTO ledger (order_no, act_id, kind, amount, activity_id, scene_id, balance_after, booked_at_ms, granted_at_ms) VALUES "+strings.Join(ledger, ","))
	exec(t, fmt.Sprintf(`INSERT INTO dead_letters (source_topic, source_partition, source_offset, processor, reason, schema_name, key_hex, value_bytes, at)
VALUES ('push.login', 0, 1, 'presence', 'uin 4294967296 outside the 32-bit space', 'surge.v1.LoginEvent', '', 3, fromUnixTimestamp64Milli(toInt64(%d)))`, at+60000))
	// Two push jobs in the window: one completed, one still sending.
	exec(t, fmt.Sprintf(`INSERT INTO job_states (job_id, from_state, to_state, reason, executor, position, targets, at_ms) VALUES
('dash-j1', 'CREATED', 'VALIDATING', '', '', 1, 0, %[1]d), ('dash-j1', 'SENDING', 'COMPLETED', '', '', 9, 100, %[2]d),
('dash-j2', 'CREATED', 'VALIDATING', '', '', 1, 0, %[1]d), ('dash-j2', 'DISPATCHING', 'SENDING', '', 'ea', 5, 100, %[2]d)`, at, at+2000))
	r := recon.New(recon.Config{Env: streams.Env{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, Store: store})
	if _, bad, err := r.Run(context.Background(), recon.Hour(dashboardHour, recon.AttemptH1)); err != nil || bad == 0 {
		t.Fatalf("reconciling the seeded hour: %d mismatches, %v", bad, err)
	}
	secret := strings.Repeat("k", 40)
	keys, err := apikey.Parse("ops:" + secret)
	if err != nil {
		t.Fatal(err)
	}
	d := &recon.Dashboard{Store: store, Keys: keys, Hours: 24, Now: func() time.Time { return dashboardHour.Add(2 * time.Hour) },
		Log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Pool: func(context.Context) (recon.PoolLevel, error) { return recon.PoolLevel{Pooled: 1234, Leased: 56}, nil }}
	if len(admin) > 0 {
		d.Admin = admin[0]
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(srv.Close)
	return srv, secret
}

// The page needs a key, shows the seeded mismatch, dead letter and chart,
// and its drill-down lists the order that did not book; bad or hostile
// drill-down parameters are refused, never run as SQL.
func TestDashboardOverHTTP(t *testing.T) {
	// A consumer group 6 records behind on a broker, for the lag section.
	k, err := embedded.StartKafka()
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.DefaultProduceTopic("dash-topic"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "dash-topic"); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte{byte(i)}}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	offs := kadm.Offsets{}
	offs.AddOffset("dash-topic", 0, 4, -1)
	if _, err := adm.CommitOffsets(ctx, "dash-group", offs); err != nil {
		t.Fatal(err)
	}
	srv, key := seedDashboard(t, adm)
	get := func(c *http.Client, path string, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if len(header) == 2 {
			req.Header.Set(header[0], header[1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	plain := &http.Client{}
	if code, _ := get(plain, "/"); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d, want 401", code)
	}
	if code, _ := get(plain, "/?key=wrong"); code != http.StatusUnauthorized {
		t.Fatalf("wrong key: %d, want 401", code)
	}
	if code, _ := get(plain, "/", "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
		t.Fatalf("wrong bearer: %d, want 401", code)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	code, page := get(browser, "/?key="+key) // sets the cookie, redirects to /
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	for _, want := range []string{"activity=dash-act scene=rain", "push.login", "outside the 32-bit space", "<polyline", "granted_vs_booked",
		`<td>dash-group</td><td>Empty</td><td class="n bad">6</td>`,
		`<td>COMPLETED</td><td class="n">1</td>`, `<td>SENDING</td><td class="n">1</td>`, // jobs by their latest state
		`<b id="pool-pooled">1234</b>`,                                        // the uin pool's level
		`<time datetime="2026-11-20T12:00:00Z">2026-11-20 12:00 UTC</time>`} { // in UTC until the script shows the viewer's zone
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	req, _ := http.NewRequest("GET", srv.URL+"/", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := plain.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.Header.Get("Refresh") != "30" {
		t.Errorf("overview's Refresh header: %q, want 30 (it reloads itself)", resp.Header.Get("Refresh"))
	}
	scope := url.QueryEscape("activity=dash-act scene=rain grants=20 lost=1 doubled=0")
	code, detail := get(browser, fmt.Sprintf("/mismatch?check=granted_vs_booked&hour=%d&scope=%s", dashboardHour.UnixMilli(), scope))
	if code != http.StatusOK || !strings.Contains(detail, "dash-u7") || strings.Contains(detail, "dash-u8<") {
		t.Fatalf("drill-down: %d, want the one order that did not book (dash-u7):\n%s", code, detail)
	}
	for _, bad := range []string{
		"/mismatch?check=granted_vs_booked&hour=x&scope=a",
		"/mismatch?check=drop_table&hour=1&scope=a",
		"/mismatch?check=granted_vs_booked&hour=1",
	} {
		if code, _ := get(browser, bad); code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
	inject := url.QueryEscape(`x' OR 1=1 --`)
	if code, _ := get(browser, fmt.Sprintf("/mismatch?check=granted_vs_booked&hour=%d&scope=%s", dashboardHour.UnixMilli(), inject)); code != http.StatusNotFound {
		t.Errorf("a quote in the scope: %d, want 404 (matched as text, nothing found)", code)
	}
	// The key's redirect stays on this page's host, whatever the path.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for path, want := range map[string]string{"/?key=" + key: "/", "//evil.example/?key=" + key: "/", "/%5C%5Cevil.example/?key=" + key: "/",
		"/mismatch?check=c&key=" + key: "/mismatch?check=c"} {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != want {
			t.Errorf("%s redirects (%d) to %q, want %q", path, resp.StatusCode, loc, want)
		}
	}
	code, body := get(plain, "/api/report", "Authorization", "Bearer "+key)
	var rep recon.Report
	if code != http.StatusOK || json.Unmarshal([]byte(body), &rep) != nil || len(rep.Open) == 0 {
		t.Errorf("/api/report: %d %s", code, body)
	}
}

// The page in a real headless browser (Debian's chromium): it loads, shows
// the seeded mismatch, and its details link opens the drill-down with the
// order that did not book.
func TestDashboardInBrowser(t *testing.T) {
	chrome := os.Getenv("SURGE_TEST_CHROME")
	if chrome == "" {
		if os.Getenv("SURGE_TEST_REQUIRE_REAL") == "1" {
			t.Fatal("SURGE_TEST_REQUIRE_REAL=1 but SURGE_TEST_CHROME is not set (scripts/chromium.sh)")
		}
		t.Skip("no browser: set SURGE_TEST_CHROME (scripts/chromium.sh)")
	}
	srv, key := seedDashboard(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 1500))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("browser: %s: %v", what, err)
		}
	}
	// A viewer in Shanghai (UTC+8) sees the page's times in their zone.
	must("a tab", chromedp.Do(ctx, chromedp.Navigate("about:blank")))
	_, err := chromedp.Call(ctx, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "Asia/Shanghai"})
	must("time zone", err)
	must("open the page", chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?key="+key), chromedp.WaitVisible(chromedp.CSS("#mismatches"))))
	heading, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("h1")))
	must("heading", err)
	if !strings.Contains(heading, "now 2026-11-20 20:00 GMT+8") {
		t.Errorf("heading in Shanghai: %q, want now 2026-11-20 20:00 GMT+8 (12:00 UTC)", heading)
	}
	jobs, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#jobs")))
	must("jobs", err)
	if !strings.Contains(jobs, "COMPLETED") || !strings.Contains(jobs, "SENDING") {
		t.Errorf("push jobs by state in the browser:\n%s", jobs)
	}
	if dir := os.Getenv("SURGE_TEST_SCREENSHOTS"); dir != "" { // to look at the page
		png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		must("screenshot", err)
		must("screenshot", os.WriteFile(dir+"/recon-overview.png", png, 0o644))
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	must("title", err)
	mismatches, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#mismatches")))
	must("mismatches", err)
	polylines, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#chart polyline").length`))
	must("chart", err)
	must("drill down", chromedp.Do(ctx, chromedp.Click(chromedp.Search(`//tr[contains(., "activity=dash-act")]//a[@class="drill"]`)),
		chromedp.WaitVisible(chromedp.CSS("#detail"))))
	drillURL, err := chromedp.Run(ctx, chromedp.Location())
	must("location", err)
	detail, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#detail")))
	must("detail", err)
	if !strings.Contains(title, "surge reconciliation") || !strings.Contains(mismatches, "activity=dash-act scene=rain") {
		t.Fatalf("overview in the browser: title %q, mismatches:\n%s", title, mismatches)
	}
	if polylines != 1 {
		t.Errorf("grants-per-minute chart: %d lines, want 1", polylines)
	}
	if !strings.Contains(drillURL, "/mismatch?") || !strings.Contains(detail, "dash-u7") {
		t.Fatalf("drill-down at %s shows:\n%s", drillURL, detail)
	}
}
