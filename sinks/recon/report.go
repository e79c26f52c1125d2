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

// Totals over the whole tables.
type Totals struct {
	GrantedCash  int64 `json:"granted_cash"`
	Booked       int64 `json:"booked"`
	Grants       int64 `json:"grants"`
	Bookings     int64 `json:"bookings"`
	Deliveries   int64 `json:"deliveries"`
	JobsComplete int64 `json:"jobs_completed"`
}

// BuildReport reads recon_results (and the fact tables for totals).
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
	tot, err := st.QueryStrings(ctx, `SELECT
  (SELECT sumIf(amount, award_type = 'CASH') FROM grants FINAL),
  (SELECT count() FROM grants FINAL),
  (SELECT sumIf(amount, kind = 'GRANT') FROM ledger FINAL),
  (SELECT count() FROM ledger FINAL),
  (SELECT count() FROM deliveries FINAL),
  (SELECT uniqExactIf(job_id, to_state = 'COMPLETED') FROM job_states FINAL)`)
	if err != nil {
		return nil, err
	}
	t := tot[0]
	rep.Totals = Totals{GrantedCash: atoi(t[0]), Grants: atoi(t[1]), Booked: atoi(t[2]), Bookings: atoi(t[3]), Deliveries: atoi(t[4]), JobsComplete: atoi(t[5])}
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
	fmt.Fprintf(w, "\ntotals: %d grants, %d cents granted in cash, %d bookings, %d cents booked; %d delivery rows, %d jobs completed\n",
		t.Grants, t.GrantedCash, t.Bookings, t.Booked, t.Deliveries, t.JobsComplete)
	return nil
}
