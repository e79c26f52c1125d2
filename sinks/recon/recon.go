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
// Both wallet checks read wallet_orders, where the sinks' rows are folded
// per order as they arrive, so a run reads one row per order of its window
// and joins nothing; a booking counts in the window of its grant.
//
// Each check writes ReconResult records to platform.recon and the
// recon_results table; a mismatch is also logged and counted (alerts).
package recon

import (
	"context"
	"fmt"
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

// Config configures a reconciler.
type Config struct {
	streams.Env
	Store    clickhouse.Store // the facts the sinks wrote (required)
	Producer *kgo.Client      // may be nil: results go to the table only
	Topic    string           // default platform.recon in the namespace
	// Lag is how old a grant must be before the near-real-time check
	// expects it booked (booking runs behind the grant peak; default 5 min).
	Lag time.Duration
}

// EnsureDefaults fills what the Config left out.
func (c *Config) EnsureDefaults() {
	c.Env.EnsureDefaults()
	if c.Topic == "" {
		c.Topic = c.Env.Topic(schemas.TopicRecon)
	}
	if c.Lag == 0 {
		c.Lag = 5 * time.Minute
	}
}

// Reconciler runs the checks.
type Reconciler struct {
	cfg       Config
	mMismatch metrics.CounterVec
	mRuns     metrics.CounterVec
}

// New returns a reconciler.
func New(cfg Config) *Reconciler {
	cfg.EnsureDefaults()
	return &Reconciler{cfg: cfg,
		mMismatch: cfg.Metrics.NewCounterVec("surge_recon_mismatches_total", "reconciliation mismatches found", "check"),
		mRuns:     cfg.Metrics.NewCounterVec("surge_recon_runs_total", "reconciliation runs", "attempt", "outcome")}
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
	var all []*pb.ReconResult
	for i, check := range []func(context.Context, Window) ([]*pb.ReconResult, error){r.walletChecks, r.targetsVsDeliveries} {
		t0 := time.Now()
		res, err := check(ctx, w)
		r.cfg.Log.Debug("recon: check ran", "check", i, "took", time.Since(t0))
		if err != nil {
			r.mRuns.With(w.Attempt, "failed").Inc()
			return nil, 0, err
		}
		all = append(all, res...)
	}
	now := r.cfg.Now().UnixMilli()
	mismatches := 0
	for _, x := range all {
		x.HourStartMs, x.RunAtMs, x.Attempt = w.From.UnixMilli(), now, w.Attempt
		if x.Mismatch {
			mismatches++
			r.mMismatch.With(x.Check).Inc()
			r.cfg.Log.Warn("reconciliation mismatch", "check", x.Check, "scope", x.Scope, "expected", x.Expected,
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
	w := clickhouse.NewRowWriter(sink.Columns)
	recs := make([]*kgo.Record, 0, len(all))
	for _, x := range all {
		rec, err := streams.NewRecord(r.cfg.Topic, []byte(x.Check), x)
		if err != nil {
			return err
		}
		recs = append(recs, rec)
		clickhouse.WriteRecon(w, x)
	}
	if err := r.cfg.Store.Insert(ctx, sink.Table, sink.Columns, w); err != nil {
		return fmt.Errorf("recon: write results: %w", err)
	}
	if r.cfg.Producer != nil {
		if err := r.cfg.Producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("recon: publish results: %w", err)
		}
	}
	return nil
}

func atoi(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }

// walletOrders is one folded row per cash order granted in w: FINAL
// finishes the folds the background merges have not done yet (cheap: the
// table is sorted by grant minute and order). nb is the number of
// distinct bookings, order_booked what they paid.
func walletOrders(w Window) string {
	return fmt.Sprintf(`(SELECT activity_id, scene_id, act_id, has_grant, granted AS order_granted, has_token,
       token_amount AS order_token, length(bookings) AS nb, booked_amount * nb AS order_booked
  FROM wallet_orders FINAL WHERE %s)`, w.between("minute_ms"))
}

// walletChecks runs granted_vs_booked and tokens_vs_ledger in one pass
// over the window, rolled up per activity and scene. A user's granted and
// booked sums can only differ if one of the user's orders does (its
// bookings did not pay what it granted), so the pass counts those orders
// ("off") instead of grouping millions of users; only when some exist does
// usersOff name the users who disagree (at most 100 per scene).
func (r *Reconciler) walletChecks(ctx context.Context, w Window) ([]*pb.ReconResult, error) {
	rows, err := r.cfg.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT activity_id, scene_id,
       countIf(has_grant = 1), sum(order_granted), sum(order_booked),
       countIf(has_grant = 1 AND nb = 0), countIf(nb > 1),
       countIf(has_token = 1), sum(order_token), sumIf(order_booked, has_token = 1),
       countIf(has_token = 1 AND nb = 0), countIf(nb > 0 AND has_token = 0),
       countIf(order_booked != order_granted)
FROM %s
GROUP BY activity_id, scene_id ORDER BY activity_id, scene_id`, walletOrders(w)))
	if err != nil {
		return nil, fmt.Errorf("recon %s, %s: %w", GrantedVsBooked, TokensVsLedger, err)
	}
	var users map[[2]string]string
	for _, row := range rows {
		if atoi(row[12]) > 0 {
			if users, err = r.usersOff(ctx, w); err != nil {
				return nil, err
			}
			break
		}
	}
	var granted, tokens []*pb.ReconResult
	for _, row := range rows {
		scope := fmt.Sprintf("activity=%s scene=%s", row[0], row[1])
		g, booked, lost, doubled := atoi(row[3]), atoi(row[4]), atoi(row[5]), atoi(row[6])
		if atoi(row[2]) > 0 || booked > 0 {
			granted = append(granted, &pb.ReconResult{Check: GrantedVsBooked, Expected: g, Actual: booked,
				Scope:    fmt.Sprintf("%s grants=%s lost=%d doubled=%d", scope, row[2], lost, doubled),
				Mismatch: g != booked || lost > 0 || doubled > 0})
			for _, u := range strings.Fields(users[[2]string{row[0], row[1]}]) {
				f := strings.Split(u, ":")
				if len(f) == 3 {
					granted = append(granted, &pb.ReconResult{Check: GrantedVsBooked, Scope: "user=" + f[0], Expected: atoi(f[1]), Actual: atoi(f[2]), Mismatch: true})
				}
			}
		}
		unbooked, orphans := atoi(row[10]), atoi(row[11])
		if atoi(row[7]) > 0 || orphans > 0 {
			tokens = append(tokens, &pb.ReconResult{Check: TokensVsLedger, Expected: atoi(row[8]), Actual: atoi(row[9]),
				Scope:    fmt.Sprintf("%s tokens=%s unbooked=%d", scope, row[7], unbooked),
				Mismatch: unbooked > 0 || atoi(row[8]) != atoi(row[9])})
		}
		if orphans > 0 {
			tokens = append(tokens, &pb.ReconResult{Check: TokensVsLedger, Scope: fmt.Sprintf("%s entries without a token=%d", scope, orphans),
				Expected: 0, Actual: orphans, Mismatch: true})
		}
	}
	return append(granted, tokens...), nil
}

// usersOff lists, per activity and scene, the users whose granted and
// booked sums differ in w, as "user:granted:booked" (at most 100 each). It
// groups only the users with an order that did not book what it granted.
func (r *Reconciler) usersOff(ctx context.Context, w Window) (map[[2]string]string, error) {
	orders := walletOrders(w)
	rows, err := r.cfg.Store.QueryStrings(ctx, fmt.Sprintf(`
SELECT activity_id, scene_id,
       arrayStringConcat(arraySlice(groupArrayIf(concat(act_id, ':', toString(granted), ':', toString(booked)), granted != booked), 1, 100), ' ')
FROM (
  SELECT activity_id, scene_id, act_id, sum(order_granted) AS granted, sum(order_booked) AS booked
  FROM %s
  WHERE act_id IN (SELECT act_id FROM %s WHERE order_booked != order_granted)
  GROUP BY activity_id, scene_id, act_id)
GROUP BY activity_id, scene_id`, orders, orders))
	if err != nil {
		return nil, fmt.Errorf("recon %s, users: %w", GrantedVsBooked, err)
	}
	out := make(map[[2]string]string, len(rows))
	for _, row := range rows {
		out[[2]string{row[0], row[1]}] = row[2]
	}
	return out, nil
}

func (r *Reconciler) targetsVsDeliveries(ctx context.Context, w Window) ([]*pb.ReconResult, error) {
	rows, err := r.cfg.Store.QueryStrings(ctx, fmt.Sprintf(`
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
	if tick == 0 {
		tick = time.Minute
	}
	type state struct{ ok bool }
	hours := map[int64]*state{}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		now := r.cfg.Now()
		end := now.Add(-r.cfg.Lag).Truncate(time.Minute) // wallet_orders is folded per minute
		if _, _, err := r.Run(ctx, Window{From: end.Add(-time.Minute), To: end, Attempt: AttemptRealTime}); err != nil && ctx.Err() == nil {
			r.cfg.Log.Warn("recon: near-real-time run failed", "err", err)
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
					r.cfg.Log.Error("recon: hour still not reconciled at h+2", "hour", h2.UTC().Format(time.RFC3339))
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
