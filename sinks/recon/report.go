package recon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"surge/sinks/clickhouse"
)

// HourStatus is the reconciliation state of one hour and check.
type HourStatus struct {
	Hour       time.Time `json:"hour"`
	Check      string    `json:"check"`
	Attempts   []string  `json:"attempts"`
	Results    int       `json:"results"`
	Mismatches int       `json:"mismatches"`
}

// Mismatch is one open mismatch (its latest result still disagrees).
type Mismatch struct {
	Hour     time.Time `json:"hour"`
	Check    string    `json:"check"`
	Scope    string    `json:"scope"`
	Expected int64     `json:"expected"`
	Actual   int64     `json:"actual"`
	Attempt  string    `json:"attempt"`
}

// Report is what an operator reads.
type Report struct {
	Since  time.Time    `json:"since"`
	Hours  []HourStatus `json:"hours"`
	Open   []Mismatch   `json:"open_mismatches"`
	Totals Totals       `json:"totals"`
}

// Totals over the reconciled hours of the report, as their latest runs
// counted them: read from recon_results, so a report costs the same on a
// billion delivery rows as on a thousand.
type Totals struct {
	Grants       int64 `json:"cash_grants"`
	GrantedCash  int64 `json:"granted_cash"`
	Booked       int64 `json:"booked"`
	Lost         int64 `json:"lost_bookings"`
	Doubled      int64 `json:"double_bookings"`
	Unbooked     int64 `json:"unbooked_tokens"`
	JobsComplete int64 `json:"jobs_completed"`
	Targets      int64 `json:"targets"`
	Reached      int64 `json:"reached"`
}

// BuildReport reads recon_results: the hours since since, the mismatches
// still open, and the totals of those hours.
func BuildReport(ctx context.Context, st clickhouse.Store, since time.Time) (*Report, error) {
	rep := &Report{Since: since}
	rows, err := st.QueryStrings(ctx, fmt.Sprintf(`
SELECT hour_start_ms, check_name, arrayStringConcat(groupUniqArray(attempt), ','), count(), countIf(mismatch = 1)
FROM recon_results FINAL WHERE hour_start_ms >= %d AND attempt != '%s'
GROUP BY hour_start_ms, check_name ORDER BY hour_start_ms, check_name`, since.UnixMilli(), AttemptRealTime))
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		rep.Hours = append(rep.Hours, HourStatus{Hour: time.UnixMilli(atoi(r[0])).UTC(), Check: r[1],
			Attempts: strings.Split(r[2], ","), Results: int(atoi(r[3])), Mismatches: int(atoi(r[4]))})
	}
	rows, err = st.QueryStrings(ctx, fmt.Sprintf(`
SELECT hour_start_ms, check_name, scope, expected, actual, attempt FROM recon_results FINAL
WHERE mismatch = 1 AND hour_start_ms >= %d ORDER BY hour_start_ms, check_name, scope LIMIT 1000`, since.UnixMilli()))
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		rep.Open = append(rep.Open, Mismatch{Hour: time.UnixMilli(atoi(r[0])).UTC(), Check: r[1], Scope: r[2],
			Expected: atoi(r[3]), Actual: atoi(r[4]), Attempt: r[5]})
	}
	scene := fmt.Sprintf("check_name = '%s' AND startsWith(scope, 'activity=')", GrantedVsBooked)
	tokens := fmt.Sprintf("check_name = '%s' AND startsWith(scope, 'activity=')", TokensVsLedger)
	jobs := fmt.Sprintf("check_name = '%s'", TargetsVsDeliveries)
	count := func(field, where string) string {
		return fmt.Sprintf(`sumIf(toInt64OrZero(extract(scope, ' %s=(\\d+)')), %s)`, field, where)
	}
	tot, err := st.QueryStrings(ctx, fmt.Sprintf(`
SELECT %s, sumIf(expected, %s), sumIf(actual, %s), %s, %s, %s, countIf(%s), sumIf(expected, %s), sumIf(actual, %s)
FROM recon_results FINAL WHERE hour_start_ms >= %d AND attempt != '%s'`,
		count("grants", scene), scene, scene, count("lost", scene), count("doubled", scene), count("unbooked", tokens),
		jobs, jobs, jobs, since.UnixMilli(), AttemptRealTime))
	if err != nil {
		return nil, err
	}
	t := tot[0]
	rep.Totals = Totals{Grants: atoi(t[0]), GrantedCash: atoi(t[1]), Booked: atoi(t[2]), Lost: atoi(t[3]), Doubled: atoi(t[4]),
		Unbooked: atoi(t[5]), JobsComplete: atoi(t[6]), Targets: atoi(t[7]), Reached: atoi(t[8])}
	return rep, nil
}

// WriteJSON writes the report as JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a terminal.
func (r *Report) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "reconciliation since %s\n\n", r.Since.UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOUR (UTC)\tCHECK\tATTEMPTS\tRESULTS\tMISMATCHES\tSTATUS")
	for _, h := range r.Hours {
		status := "ok"
		if h.Mismatches > 0 {
			status = "MISMATCH"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", h.Hour.Format("2006-01-02 15:04"), h.Check, strings.Join(h.Attempts, ","), h.Results, h.Mismatches, status)
	}
	if len(r.Hours) == 0 {
		fmt.Fprintln(tw, "(no hourly runs yet)")
	}
	tw.Flush()
	fmt.Fprintf(w, "\nopen mismatches: %d\n", len(r.Open))
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, m := range r.Open {
		fmt.Fprintf(tw, "  %s\t%s\t%s\texpected %d\tactual %d\t(%s)\n", m.Hour.Format("2006-01-02 15:04"), m.Check, m.Scope, m.Expected, m.Actual, m.Attempt)
	}
	tw.Flush()
	t := r.Totals
	fmt.Fprintf(w, "\ntotals of these hours: %d cash grants, %d cents granted, %d cents booked (%d lost, %d doubled, %d tokens unbooked); %d push jobs completed, %d targets, %d reached\n",
		t.Grants, t.GrantedCash, t.Booked, t.Lost, t.Doubled, t.Unbooked, t.JobsComplete, t.Targets, t.Reached)
	return nil
}
