package recon_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"surge/sinks/recon"
	"surge/streams"
)

// recon serve's schedule on an injected clock: hour h is reconciled at
// h+1 from minute 5 (not before), and again at h+2 only when the h+1 run
// found a mismatch; a clean hour gets no h+2 run.
func TestServeRunsHourAtH1AndFallsBackAtH2(t *testing.T) {
	bad := time.Date(2026, 11, 15, 10, 0, 0, 0, time.UTC) // a lost booking
	clean := bad.Add(time.Hour)
	for _, h := range []time.Time{bad, clean} {
		at := h.UnixMilli() + 1000
		var grants, tokens, ledger []string
		for i := range 5 {
			no := fmt.Sprintf("sched-u%d_rain_%d_%d_1", i, h.Hour(), i)
			grants = append(grants, fmt.Sprintf("('%s', 'sched-u%d', 'sched-act', 'sched', 'rain', 'CASH', 10, %d)", no, i, at))
			tokens = append(tokens, fmt.Sprintf("('%s', 'sched-u%d', 'sched-act', 'rain', 10, 'PROCESSING', %d)", no, i, at))
			if h != bad || i != 0 {
				ledger = append(ledger, fmt.Sprintf("('%s', 'sched-u%d', 'GRANT', 10, 'sched-act', 'rain', 0, %d, %d)", no, i, at+500, at))
			}
		}
		exec(t, "INSERT INTO grants (order_no, act_id, activity_id, parent_activity_id, scene_id, award_type, amount, at_ms) VALUES "+strings.Join(grants, ","))
		exec(t, "INSERT INTO tokens (order_no, act_id, activity_id, scene_id, amount, status, open_time) VALUES "+strings.Join(tokens, ","))
		exec(t, "INSERT INTO ledger (order_no, act_id, kind, amount, activity_id, scene_id, balance_after, booked_at_ms, granted_at_ms) VALUES "+strings.Join(ledger, ","))
	}
	var mu sync.Mutex
	now := bad.Add(time.Hour + 4*time.Minute) // h+1, minute 4: too early
	r := recon.New(recon.Config{Store: store, Env: streams.Env{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Serve(ctx, 20*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	// The latest attempt per result (the table keeps the newest run's).
	attempts := func(h time.Time) string {
		t.Helper()
		rows, err := store.QueryStrings(context.Background(), fmt.Sprintf(
			`SELECT arrayStringConcat(arraySort(groupUniqArray(attempt)), ',') FROM recon_results FINAL WHERE hour_start_ms = %d AND startsWith(scope, 'activity=sched-act') AND attempt != '%s'`,
			h.UnixMilli(), recon.AttemptRealTime))
		if err != nil {
			t.Fatal(err)
		}
		return rows[0][0]
	}
	settle := func() { time.Sleep(400 * time.Millisecond) } // several ticks
	settle()
	if a := attempts(bad); a != "" {
		t.Fatalf("hour reconciled at h+1 minute 4 (%q): runs start at minute 5", a)
	}
	// A run that is due is waited for (a loaded machine may take more than
	// a few ticks), then asserted as before.
	until := func(ok func() bool) {
		for deadline := time.Now().Add(20 * time.Second); !ok() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	set(bad.Add(time.Hour + 6*time.Minute))
	until(func() bool { return attempts(bad) == recon.AttemptH1 })
	if a := attempts(bad); a != recon.AttemptH1 {
		t.Fatalf("at h+1 minute 6 the hour's attempts are %q, want %q", a, recon.AttemptH1)
	}
	set(clean.Add(time.Hour + 6*time.Minute)) // bad's h+2, clean's h+1
	until(func() bool { return attempts(bad) == recon.AttemptH2 && attempts(clean) == recon.AttemptH1 })
	if a := attempts(bad); a != recon.AttemptH2 {
		t.Fatalf("the mismatched hour at h+2: latest attempt %q, want %q", a, recon.AttemptH2)
	}
	if a := attempts(clean); a != recon.AttemptH1 {
		t.Fatalf("the clean hour at h+1: latest attempt %q", a)
	}
	set(clean.Add(2*time.Hour + 6*time.Minute)) // clean's h+2
	settle()
	if a := attempts(clean); a != recon.AttemptH1 {
		t.Fatalf("a clean hour ran again at h+2: latest attempt %q", a)
	}
}
