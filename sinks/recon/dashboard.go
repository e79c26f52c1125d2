package recon

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"surge/platform/apikey"
	"surge/sinks/clickhouse"
	"surge/streams/httperr"
)

// Dashboard is the operators' page of `surge recon serve`: hours with
// their status, open mismatches with a drill-down, dead letters by topic
// and reason, consumer lag per group, push jobs by state, the uin pool's
// level, totals and a chart of cash grants per minute. Server-rendered
// HTML that reloads itself every RefreshEvery; nothing is fetched from
// elsewhere, and one inline script only shows the times in the viewer's
// time zone (UTC without it). Every page needs a key: "Authorization:
// Bearer <key>", or a browser opens /?key=<key> once and keeps it in a
// cookie.
type Dashboard struct {
	Store clickhouse.Store
	Admin *kadm.Client // nil: consumer lag is not shown
	Keys  *apikey.Keys
	// Pool reads the uin pool's level (nil: not shown; it lives in Redis,
	// which recon reaches only when redis.addr is set).
	Pool  func(ctx context.Context) (PoolLevel, error)
	Hours int // hours back the page shows (default 24)
	Now   func() time.Time
	Log   *slog.Logger
}

// PoolLevel is the uin pool's central level: uins ready to hand out, and
// uins leased to pool instances.
type PoolLevel struct {
	Pooled, Leased int64
}

// RefreshEvery is how often the overview reloads itself.
const RefreshEvery = 30 * time.Second

//go:embed dashboard/*.html
var pages embed.FS

var tmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"hour": func(t time.Time) template.HTML { return timeTag(t, "2006-01-02 15:04") },
	"ms":   func(t time.Time) int64 { return t.UnixMilli() },
	"when": func(ms int64) template.HTML { return timeTag(time.UnixMilli(ms), "2006-01-02 15:04:05") },
	"link": mismatchURL,
}).ParseFS(pages, "dashboard/*.html"))

// timeTag is a time in UTC inside a <time> element whose datetime the
// page's script shows in the viewer's zone.
func timeTag(t time.Time, layout string) template.HTML {
	u := t.UTC()
	seconds := ""
	if strings.HasSuffix(layout, ":05") {
		seconds = ` data-seconds="1"`
	}
	return template.HTML(fmt.Sprintf(`<time datetime="%s"%s>%s UTC</time>`, u.Format(time.RFC3339), seconds, u.Format(layout)))
}

const keyCookie = "surge_recon_key"

// Handler serves the pages.
func (d *Dashboard) Handler() http.Handler {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Hours == 0 {
		d.Hours = 24
	}
	if d.Log == nil {
		d.Log = slog.Default()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", d.overview)
	mux.HandleFunc("GET /mismatch", d.mismatch)
	mux.HandleFunc("GET /api/report", d.reportJSON)
	return d.authenticate(mux)
}

// authenticate lets a request through with a valid key in the
// Authorization header or the cookie; ?key= sets the cookie and redirects
// to the page without it (so the key leaves the address bar and history).
func (d *Dashboard) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.URL.Query().Get("key"); k != "" {
			if _, ok := d.Keys.Caller(k); !ok {
				d.denied(w, "unknown key")
				return
			}
			http.SetCookie(w, &http.Cookie{Name: keyCookie, Value: k, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q := r.URL.Query()
			q.Del("key")
			http.Redirect(w, r, localTarget(r.URL.Path, q), http.StatusSeeOther)
			return
		}
		secret, ok := apikey.Bearer(r.Header.Get("Authorization"))
		if !ok {
			if c, err := r.Cookie(keyCookie); err == nil {
				secret = c.Value
			}
		}
		if secret == "" {
			d.denied(w, "a key is needed: open /?key=<key> once, or send Authorization: Bearer <key>")
			return
		}
		if _, ok := d.Keys.Caller(secret); !ok {
			d.denied(w, "unknown key")
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func (d *Dashboard) denied(w http.ResponseWriter, why string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="surge recon"`)
	w.WriteHeader(http.StatusUnauthorized)
	_ = tmpl.ExecuteTemplate(w, "denied.html", why)
}

// overviewData is the overview page.
type overviewData struct {
	Now         time.Time
	Report      *Report
	Failing     int // hours with mismatches
	DeadLetters []deadLetters
	DeadTotal   int64
	Lags        []groupLag
	LagErr      string
	Chart       chart
	Jobs        []jobCount // push jobs by their latest state in the window
	Pool        *PoolLevel // nil: not known
	PoolErr     string
	Refresh     int // seconds between reloads
}

type jobCount struct {
	State string
	Jobs  int64
}

type deadLetters struct {
	Topic, Reason string
	Count         int64
	LastMs        int64
}

type groupLag struct {
	Group string
	Lag   int64
	State string
}

// chart is cash grants per minute as an SVG polyline.
type chart struct {
	Points     string // "x,y x,y ..."
	Max, Total int64
	From, To   time.Time
	Width      int
	Height     int
	Empty      bool
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := d.Now()
	since := d.since(now)
	rep, err := BuildReport(ctx, d.Store, since)
	if err != nil {
		d.fail(w, err)
		return
	}
	data := overviewData{Now: now, Report: rep}
	for _, h := range rep.Hours {
		if h.Mismatches > 0 {
			data.Failing++
		}
	}
	if data.DeadLetters, err = d.deadLetters(ctx, since); err != nil {
		d.fail(w, err)
		return
	}
	for _, x := range data.DeadLetters {
		data.DeadTotal += x.Count
	}
	if data.Chart, err = d.grantsPerMinute(ctx, now); err != nil {
		d.fail(w, err)
		return
	}
	if data.Jobs, err = d.jobsByState(ctx, since); err != nil {
		d.fail(w, err)
		return
	}
	data.Lags, data.LagErr = d.lags(ctx)
	data.Pool, data.PoolErr = d.poolLevel(ctx)
	data.Refresh = int(RefreshEvery / time.Second)
	w.Header().Set("Refresh", strconv.Itoa(data.Refresh))
	d.render(w, "overview.html", data)
}

// jobsByState counts the push jobs seen since the window's start by the
// state of their latest transition.
func (d *Dashboard) jobsByState(ctx context.Context, since time.Time) ([]jobCount, error) {
	rows, err := d.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT state, count() FROM (
  SELECT job_id, argMax(to_state, (at_ms, position)) AS state FROM job_states
  WHERE at_ms >= %d GROUP BY job_id)
GROUP BY state ORDER BY count() DESC, state`, since.UnixMilli()))
	if err != nil {
		return nil, fmt.Errorf("jobs by state: %w", err)
	}
	out := make([]jobCount, 0, len(rows))
	for _, r := range rows {
		out = append(out, jobCount{State: r[0], Jobs: atoi(r[1])})
	}
	return out, nil
}

// poolLevel is the uin pool's level, or why it is not shown.
func (d *Dashboard) poolLevel(ctx context.Context) (*PoolLevel, string) {
	if d.Pool == nil {
		return nil, "not configured: recon reaches the uin pool through Redis (--redis.addr)"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lvl, err := d.Pool(ctx)
	if err != nil {
		d.Log.Warn("recon: uin pool level", "err", err)
		return nil, "Redis did not answer; the reason is in the recon service's log"
	}
	return &lvl, ""
}

// since is where the pages' window starts: Hours back, on the hour.
func (d *Dashboard) since(now time.Time) time.Time {
	return now.Add(-time.Duration(d.Hours) * time.Hour).Truncate(time.Hour)
}

func (d *Dashboard) deadLetters(ctx context.Context, since time.Time) ([]deadLetters, error) {
	rows, err := d.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT source_topic, substring(reason, 1, 160) AS why, count(), max(toUnixTimestamp64Milli(at))
FROM dead_letters FINAL WHERE at >= fromUnixTimestamp64Milli(toInt64(%d))
GROUP BY source_topic, why ORDER BY count() DESC, source_topic LIMIT 200`, since.UnixMilli()))
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	out := make([]deadLetters, 0, len(rows))
	for _, r := range rows {
		out = append(out, deadLetters{Topic: r[0], Reason: r[1], Count: atoi(r[2]), LastMs: atoi(r[3])})
	}
	return out, nil
}

// grantsPerMinute charts the last three hours of cash grants (the
// per-minute folded orders reconciliation reads).
func (d *Dashboard) grantsPerMinute(ctx context.Context, now time.Time) (chart, error) {
	to := now.Truncate(time.Minute)
	from := to.Add(-3 * time.Hour)
	rows, err := d.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT minute_ms, countIf(has_grant = 1) FROM wallet_orders FINAL
WHERE minute_ms >= %d AND minute_ms <= %d GROUP BY minute_ms ORDER BY minute_ms`, from.UnixMilli(), to.UnixMilli()))
	if err != nil {
		return chart{}, fmt.Errorf("grants per minute: %w", err)
	}
	c := chart{From: from, To: to, Width: 720, Height: 160}
	per := map[int64]int64{}
	for _, r := range rows {
		n := atoi(r[1])
		per[atoi(r[0])] = n
		c.Total += n
		c.Max = max(c.Max, n)
	}
	c.Empty = c.Total == 0
	minutes := int(to.Sub(from) / time.Minute)
	var b strings.Builder
	for i := 0; i <= minutes; i++ {
		n := per[from.Add(time.Duration(i)*time.Minute).UnixMilli()]
		x := float64(i) * float64(c.Width) / float64(minutes)
		y := float64(c.Height)
		if c.Max > 0 {
			y -= float64(n) * float64(c.Height-10) / float64(c.Max)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	c.Points = strings.TrimSpace(b.String())
	return c, nil
}

// lags is the consumer lag of every group, or why it is not known.
func (d *Dashboard) lags(ctx context.Context) ([]groupLag, string) {
	if d.Admin == nil {
		return nil, "no Kafka brokers configured (--kafka.brokers)"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	listed, err := d.Admin.ListGroups(ctx)
	if err != nil {
		d.Log.Warn("recon: consumer groups", "err", err)
		return nil, "Kafka did not answer; the reason is in the recon service's log"
	}
	lags, err := d.Admin.Lag(ctx, listed.Groups()...)
	if err != nil {
		d.Log.Warn("recon: consumer lag", "err", err)
		return nil, "Kafka did not answer; the reason is in the recon service's log"
	}
	var out []groupLag
	lags.Each(func(l kadm.DescribedGroupLag) {
		out = append(out, groupLag{Group: l.Group, Lag: l.Lag.Total(), State: l.State})
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Lag != out[j].Lag {
			return out[i].Lag > out[j].Lag
		}
		return out[i].Group < out[j].Group
	})
	return out, ""
}

// mismatchData is the drill-down page of one check, hour and scope.
type mismatchData struct {
	Check, Scope string
	Hour         time.Time
	Results      []attemptResult
	Detail       string // what the detail rows are
	Columns      []string
	Rows         [][]string
}

type attemptResult struct {
	Attempt          string
	Expected, Actual int64
	Mismatch         bool
	RunAtMs          int64
}

func (d *Dashboard) mismatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	check, scope := q.Get("check"), q.Get("scope")
	hourMs, err := strconv.ParseInt(q.Get("hour"), 10, 64)
	if err != nil || !knownCheck(check) || scope == "" || len(scope) > 512 {
		w.WriteHeader(http.StatusBadRequest)
		d.render(w, "error.html", "want ?check=<a reconciliation check>&hour=<hour start, ms>&scope=<scope>")
		return
	}
	data := mismatchData{Check: check, Scope: scope, Hour: time.UnixMilli(hourMs).UTC()}
	ctx := r.Context()
	rows, err := d.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT attempt, expected, actual, mismatch, run_at_ms FROM recon_results
WHERE check_name = %s AND hour_start_ms = %d AND scope = %s ORDER BY run_at_ms`, quote(check), hourMs, quote(scope)))
	if err != nil {
		d.fail(w, err)
		return
	}
	for _, x := range rows {
		data.Results = append(data.Results, attemptResult{Attempt: x[0], Expected: atoi(x[1]), Actual: atoi(x[2]), Mismatch: x[3] == "1", RunAtMs: atoi(x[4])})
	}
	if len(data.Results) == 0 {
		w.WriteHeader(http.StatusNotFound)
		d.render(w, "error.html", "no reconciliation result for that check, hour and scope")
		return
	}
	if err := d.detail(ctx, &data, hourMs); err != nil {
		d.fail(w, err)
		return
	}
	d.render(w, "mismatch.html", data)
}

// detail fills the rows behind a wallet result: the orders of the hour,
// in the result's activity and scene (or of its user), that did not book
// exactly what they granted.
func (d *Dashboard) detail(ctx context.Context, m *mismatchData, hourMs int64) error {
	if m.Check != GrantedVsBooked && m.Check != TokensVsLedger {
		return nil
	}
	var where string
	if user, ok := strings.CutPrefix(m.Scope, "user="); ok {
		where = "act_id = " + quote(user)
		m.Detail = "orders of this user in the hour that did not book exactly what they granted"
	} else {
		act, scene := scopeField(m.Scope, "activity"), scopeField(m.Scope, "scene")
		if act == "" {
			return nil
		}
		where = fmt.Sprintf("activity_id = %s AND scene_id = %s", quote(act), quote(scene))
		m.Detail = "orders of this activity and scene in the hour that did not book exactly what they granted (at most 200)"
	}
	h := Hour(time.UnixMilli(hourMs), AttemptH1)
	rows, err := d.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT act_id, order_granted, has_token, order_token, nb, order_booked FROM %s
WHERE %s AND (order_booked != order_granted OR nb != 1 OR (has_token = 1 AND nb = 0))
ORDER BY act_id LIMIT 200`, walletOrders(h), where))
	if err != nil {
		return fmt.Errorf("orders behind the result: %w", err)
	}
	m.Columns = []string{"user (actID)", "granted", "token", "token amount", "bookings", "booked"}
	m.Rows = rows
	return nil
}

// scopeField reads "name=value" out of a scope ("activity=a scene=s ...").
func scopeField(scope, name string) string {
	for _, f := range strings.Fields(scope) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

func knownCheck(c string) bool {
	switch c {
	case GrantedVsBooked, TokensVsLedger, TargetsVsDeliveries:
		return true
	}
	return false
}

// quote is a ClickHouse string literal.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

func (d *Dashboard) reportJSON(w http.ResponseWriter, r *http.Request) {
	rep, err := BuildReport(r.Context(), d.Store, d.since(d.Now()))
	if err != nil {
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Unavailable, "report unavailable")
		d.Log.Warn("recon: report", "err", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = rep.WriteJSON(w)
}

func (d *Dashboard) render(w http.ResponseWriter, page string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := tmpl.ExecuteTemplate(w, page, data); err != nil {
		d.Log.Warn("recon: render", "page", page, "err", err)
	}
}

// fail answers a page whose query failed: the error goes to the log, the
// page says only that (a store's error text can quote the query and the
// caller's input back).
func (d *Dashboard) fail(w http.ResponseWriter, err error) {
	d.Log.Warn("recon: page", "err", err)
	w.WriteHeader(http.StatusServiceUnavailable)
	d.render(w, "error.html", "ClickHouse did not answer; the reason is in the recon service's log")
}

// localTarget is a redirect to this page's own path with query q: a path
// that a browser would read as another host (//host, /\host) or that is
// not absolute goes to the overview instead (no open redirect).
func localTarget(path string, q url.Values) string {
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") || strings.HasPrefix(path, "/\\") {
		path = "/"
	}
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}

// mismatchURL links an open mismatch to its drill-down.
func mismatchURL(m Mismatch) string {
	return "/mismatch?" + url.Values{"check": {m.Check}, "hour": {strconv.FormatInt(m.Hour.UnixMilli(), 10)}, "scope": {m.Scope}}.Encode()
}
