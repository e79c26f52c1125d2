// Package recon reconciles the facts the sinks wrote to ClickHouse: for
// each hour h, at h+1 and again at h+2 (the fallback, for late bookings or
// a failed run), and near-real-time every minute over a recent window:
//
//   - granted_vs_booked: cash granted against booked, per activity and
//     scene and per user; a grant with no booking is a lost booking, an
//     order number booked twice a double booking;
//   - tokens_vs_ledger: every token has its ledger entry and every entry
//     its token;
//   - targets_vs_deliveries: each completed push job reached (delivered or
//     queued offline) exactly its filtered targets.
//
// Each check writes ReconResult records to platform.recon and the
// recon_results table; a mismatch is also logged and counted (alerts).
package recon

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
	"surge/streams/metrics"
)

// Attempts.
const (
	AttemptH1       = "h+1"
	AttemptH2       = "h+2"
	AttemptRealTime = "near-real-time"
)

// Checks.
const (
	GrantedVsBooked     = "granted_vs_booked"
	TokensVsLedger      = "tokens_vs_ledger"
	TargetsVsDeliveries = "targets_vs_deliveries"
)

// Reconciler runs the checks.
type Reconciler struct {
	Store    clickhouse.Store
	Producer *kgo.Client // may be nil: results go to the table only
	Topic    string      // default platform.recon
	Log      *slog.Logger
	Metrics  *metrics.Registry
	// Lag is how old a grant must be before the near-real-time check
	// expects it booked (booking runs behind the grant peak).
	Lag time.Duration
	Now func() time.Time

	ready     bool
	mMismatch metrics.CounterVec
	mRuns     metrics.CounterVec
}

func (r *Reconciler) init() {
	if r.Log == nil {
		r.Log = slog.Default()
	}
	if r.Metrics == nil {
		r.Metrics = metrics.NewRegistry()
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.Topic == "" {
		r.Topic = schemas.TopicRecon
	}
	if r.Lag == 0 {
		r.Lag = 5 * time.Minute
	}
	if !r.ready {
		r.ready = true
		r.mMismatch = r.Metrics.NewCounterVec("surge_recon_mismatches_total", "reconciliation mismatches found", "check")
		r.mRuns = r.Metrics.NewCounterVec("surge_recon_runs_total", "reconciliation runs", "attempt", "outcome")
	}
}

// Window is the time range a run covers.
type Window struct {
	From, To time.Time
	Attempt  string
}

// Hour returns the window of the hour starting at h.
func Hour(h time.Time, attempt string) Window {
	h = h.Truncate(time.Hour)
	return Window{From: h, To: h.Add(time.Hour), Attempt: attempt}
}

func (w Window) between(col string) string {
	return fmt.Sprintf("%s >= %d AND %s < %d", col, w.From.UnixMilli(), col, w.To.UnixMilli())
}

// Run runs every check over w and publishes the results; it returns them
// and how many are mismatches.
func (r *Reconciler) Run(ctx context.Context, w Window) ([]*pb.ReconResult, int, error) {
	r.init()
	var all []*pb.ReconResult
	for i, check := range []func(context.Context, Window) ([]*pb.ReconResult, error){r.grantedVsBooked, r.tokensVsLedger, r.targetsVsDeliveries} {
		t0 := time.Now()
		res, err := check(ctx, w)
		r.Log.Debug("recon: check ran", "check", i, "took", time.Since(t0))
		if err != nil {
			r.mRuns.With(w.Attempt, "failed").Inc()
			return nil, 0, err
		}
		all = append(all, res...)
	}
	now := r.Now().UnixMilli()
	mismatches := 0
	for _, x := range all {
		x.HourStartMs, x.RunAtMs, x.Attempt = w.From.UnixMilli(), now, w.Attempt
		if x.Mismatch {
			mismatches++
			r.mMismatch.With(x.Check).Inc()
			r.Log.Warn("reconciliation mismatch", "check", x.Check, "scope", x.Scope, "expected", x.Expected,
				"actual", x.Actual, "from", w.From.UTC().Format(time.RFC3339), "attempt", w.Attempt)
		}
	}
	if err := r.publish(ctx, all); err != nil {
		r.mRuns.With(w.Attempt, "failed").Inc()
		return all, mismatches, err
	}
	r.mRuns.With(w.Attempt, "ok").Inc()
	return all, mismatches, nil
}

func (r *Reconciler) publish(ctx context.Context, all []*pb.ReconResult) error {
	if len(all) == 0 {
		return nil
	}
	sink := clickhouse.Recon()
	sink.Bind(r.Store)
	var recs []*kgo.Record
	rows := "INSERT INTO recon_results (check_name, hour_start_ms, scope, expected, actual, mismatch, attempt, run_at_ms) VALUES "
	for i, x := range all {
		rec, err := streams.NewRecord(r.Topic, []byte(x.Check), x)
		if err != nil {
			return err
		}
		recs = append(recs, rec)
		row, err := sink.Row(rec)
		if err != nil {
			return err
		}
		if i > 0 {
			rows += ","
		}
		rows += row
	}
	if err := r.Store.Exec(ctx, rows); err != nil {
		return fmt.Errorf("recon: write results: %w", err)
	}
	if r.Producer != nil {
		if err := r.Producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("recon: publish results: %w", err)
		}
	}
	return nil
}

func atoi(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

// ledgerByOrder is the booked side: bookings per order number, of the
// bookings made since the window opened (nothing books before its grant).
// Rows a sink redelivered are identical (same booked_at) and count once;
// a second booking of one order number (another booked_at) counts twice.
// Joins are on a 64-bit hash of the order number (k): several times faster
// than on the string, and a collision among 10^7 keys has odds ~10^-5.
func ledgerByOrder(w Window) string {
	return fmt.Sprintf(`(SELECT cityHash64(order_no) AS k, uniqExact(booked_at_ms) AS n, any(amount) * n AS booked FROM ledger WHERE kind = 'GRANT' AND booked_at_ms >= %d GROUP BY k)`, w.From.UnixMilli())
}

func (r *Reconciler) grantedVsBooked(ctx context.Context, w Window) ([]*pb.ReconResult, error) {
	// One join, aggregated per user, rolled up per activity and scene; the
	// users who disagree ride along (at most 100 per scene).
	rows, err := r.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT activity_id, scene_id, sum(n), sum(granted), sum(booked), sum(lost), sum(doubled),
       arrayStringConcat(arraySlice(groupArrayIf(concat(act_id, ':', toString(granted), ':', toString(booked)), granted != booked), 1, 100), ' ')
FROM (
  SELECT g.activity_id AS activity_id, g.scene_id AS scene_id, g.act_id AS act_id, count() AS n, sum(g.amount) AS granted,
         sum(l.booked) AS booked, countIf(l.n = 0) AS lost, countIf(l.n > 1) AS doubled
  FROM (SELECT cityHash64(order_no) AS k, act_id, activity_id, scene_id, amount FROM grants FINAL WHERE award_type = 'CASH' AND %s) AS g
  LEFT JOIN %s AS l USING (k)
  GROUP BY activity_id, scene_id, act_id)
GROUP BY activity_id, scene_id ORDER BY activity_id, scene_id`, w.between("at_ms"), ledgerByOrder(w)))
	if err != nil {
		return nil, fmt.Errorf("recon %s: %w", GrantedVsBooked, err)
	}
	var out []*pb.ReconResult
	for _, row := range rows {
		granted, booked, lost, doubled := atoi(row[3]), atoi(row[4]), atoi(row[5]), atoi(row[6])
		scope := fmt.Sprintf("activity=%s scene=%s grants=%s lost=%d doubled=%d", row[0], row[1], row[2], lost, doubled)
		out = append(out, &pb.ReconResult{Check: GrantedVsBooked, Scope: scope, Expected: granted, Actual: booked,
			Mismatch: granted != booked || lost > 0 || doubled > 0})
		for _, u := range strings.Fields(row[7]) {
			f := strings.Split(u, ":")
			if len(f) == 3 {
				out = append(out, &pb.ReconResult{Check: GrantedVsBooked, Scope: "user=" + f[0], Expected: atoi(f[1]), Actual: atoi(f[2]), Mismatch: true})
			}
		}
	}
	return out, nil
}

func (r *Reconciler) tokensVsLedger(ctx context.Context, w Window) ([]*pb.ReconResult, error) {
	rows, err := r.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT count(), countIf(l.n = 0), sum(t.amount), sum(l.booked)
FROM (SELECT cityHash64(order_no) AS k, any(amount) AS amount FROM tokens WHERE status = 'PROCESSING' AND %s GROUP BY k) AS t
LEFT JOIN %s AS l USING (k)`, w.between("open_time"), ledgerByOrder(w)))
	if err != nil {
		return nil, fmt.Errorf("recon %s: %w", TokensVsLedger, err)
	}
	orphans, err := r.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT count() FROM (SELECT DISTINCT cityHash64(order_no) AS k FROM ledger WHERE kind = 'GRANT' AND %s) AS l
LEFT ANTI JOIN (SELECT DISTINCT cityHash64(order_no) AS k FROM tokens WHERE open_time < %d) AS t USING (k)`, w.between("booked_at_ms"), w.To.UnixMilli()))
	if err != nil {
		return nil, fmt.Errorf("recon %s orphans: %w", TokensVsLedger, err)
	}
	var out []*pb.ReconResult
	if len(rows) == 1 && atoi(rows[0][0]) > 0 {
		unbooked := atoi(rows[0][1])
		out = append(out, &pb.ReconResult{Check: TokensVsLedger, Scope: fmt.Sprintf("tokens=%s unbooked=%d", rows[0][0], unbooked),
			Expected: atoi(rows[0][2]), Actual: atoi(rows[0][3]), Mismatch: unbooked > 0})
	}
	if n := atoi(orphans[0][0]); n > 0 {
		out = append(out, &pb.ReconResult{Check: TokensVsLedger, Scope: fmt.Sprintf("entries without a token=%d", n), Expected: 0, Actual: n, Mismatch: true})
	}
	return out, nil
}

func (r *Reconciler) targetsVsDeliveries(ctx context.Context, w Window) ([]*pb.ReconResult, error) {
	rows, err := r.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT j.job_id, j.targets, d.reached
FROM (SELECT job_id, max(targets) AS targets FROM job_states FINAL WHERE to_state = 'QUEUED'
      AND job_id IN (SELECT job_id FROM job_states FINAL WHERE to_state = 'COMPLETED' AND %s) GROUP BY job_id) AS j
LEFT JOIN (SELECT job_id, uniqExact(uin) AS reached FROM deliveries FINAL WHERE status IN ('DELIVERED', 'QUEUED_OFFLINE') GROUP BY job_id) AS d
USING (job_id) ORDER BY j.job_id`, w.between("at_ms")))
	if err != nil {
		return nil, fmt.Errorf("recon %s: %w", TargetsVsDeliveries, err)
	}
	var out []*pb.ReconResult
	for _, row := range rows {
		want, got := atoi(row[1]), atoi(row[2])
		out = append(out, &pb.ReconResult{Check: TargetsVsDeliveries, Scope: "job=" + row[0], Expected: want, Actual: got, Mismatch: want != got})
	}
	return out, nil
}

// Serve runs the schedule until ctx ends: every minute the near-real-time
// window (grants between Lag+1m and Lag ago); for hour h the full run at
// h+1 (from minute 5, when the sinks have caught up) and the fallback at
// h+2 when the h+1 run failed or found mismatches.
func (r *Reconciler) Serve(ctx context.Context, tick time.Duration) {
	r.init()
	if tick == 0 {
		tick = time.Minute
	}
	type state struct{ ok bool }
	hours := map[int64]*state{}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		now := r.Now()
		end := now.Add(-r.Lag)
		if _, _, err := r.Run(ctx, Window{From: end.Add(-time.Minute), To: end, Attempt: AttemptRealTime}); err != nil && ctx.Err() == nil {
			r.Log.Warn("recon: near-real-time run failed", "err", err)
		}
		cur := now.Truncate(time.Hour)
		if now.Sub(cur) >= 5*time.Minute {
			h1 := cur.Add(-time.Hour) // hour h at h+1
			if st := hours[h1.UnixMilli()]; st == nil {
				_, bad, err := r.Run(ctx, Hour(h1, AttemptH1))
				hours[h1.UnixMilli()] = &state{ok: err == nil && bad == 0}
			}
			h2 := cur.Add(-2 * time.Hour) // hour h at h+2, only if h+1 was not clean
			if st := hours[h2.UnixMilli()]; st != nil && !st.ok {
				_, bad, err := r.Run(ctx, Hour(h2, AttemptH2))
				st.ok = err == nil && bad == 0
				if !st.ok {
					r.Log.Error("recon: hour still not reconciled at h+2", "hour", h2.UTC().Format(time.RFC3339))
				}
				delete(hours, h2.UnixMilli())
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
