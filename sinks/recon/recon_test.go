package recon_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"surge/sinks/clickhouse"
	"surge/sinks/clickhouse/chdbhttp"
	"surge/sinks/recon"
	"surge/streams"
)

var store clickhouse.Store

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "surge-recon-")
	if err != nil {
		panic(err)
	}
	if store, err = clickhouse.OpenChDB(dir); err != nil {
		panic(err)
	}
	if _, err := clickhouse.Migrate(context.Background(), store); err != nil {
		panic(err)
	}
	code := m.Run()
	_ = store.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

func exec(t *testing.T, sql string) {
	t.Helper()
	if err := store.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
}

// One hour of clean facts, then a lost booking, a double booking and a
// lost delivery injected into the next hour: the clean hour reconciles,
// each fault is found with its scope.
func TestFindsLostDoubleAndUndelivered(t *testing.T) {
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	offsetting := base.Add(2 * time.Hour)
	for _, h := range []time.Time{base, base.Add(time.Hour), offsetting} {
		at := h.UnixMilli() + 1000
		var grants, tokens, ledger []string
		for i := range 100 {
			no := fmt.Sprintf("u%d_rain_%d_1_1", i%10, h.Hour()*1000+i)
			grants = append(grants, fmt.Sprintf("('%s', 'u%d', 'spring-live', 'spring', 'rain', 'CASH', %d, %d)", no, i%10, 10+i, at+int64(i)))
			tokens = append(tokens, fmt.Sprintf("('%s', 'u%d', 'spring-live', 'rain', %d, 'PROCESSING', %d)", no, i%10, 10+i, at+int64(i)))
			ledger = append(ledger, fmt.Sprintf("('%s', 'u%d', 'GRANT', %d, 'spring-live', 'rain', 0, %d, %d)", no, i%10, 10+i, at+5000+int64(i), at+int64(i)))
		}
		exec(t, "INSERT INTO grants (order_no, act_id, activity_id, parent_activity_id, scene_id, award_type, amount, at_ms) VALUES "+strings.Join(grants, ","))
		exec(t, "INSERT INTO tokens (order_no, act_id, activity_id, scene_id, amount, status, open_time) VALUES "+strings.Join(tokens, ","))
		if h == base {
			exec(t, "INSERT INTO ledger (order_no, act_id, kind, amount, activity_id, scene_id, balance_after, booked_at_ms, granted_at_ms) VALUES "+strings.Join(ledger, ","))
			// The sink redelivered a batch: identical rows must not count twice.
			exec(t, "INSERT INTO ledger (order_no, act_id, kind, amount, activity_id, scene_id, balance_after, booked_at_ms, granted_at_ms) VALUES "+strings.Join(ledger[:10], ","))
		} else if h == offsetting {
			// Two bookings that paid the wrong amounts, 5 too much to u2
			// and 5 too little to u3: the scene's sums agree, the users'
			// do not.
			ledger[2] = strings.Replace(ledger[2], "'GRANT', 12,", "'GRANT', 17,", 1)
			ledger[3] = strings.Replace(ledger[3], "'GRANT', 13,", "'GRANT', 8,", 1)
			exec(t, "INSERT INTO ledger (order_no, act_id, kind, amount, activity_id, scene_id, balance_after, booked_at_ms, granted_at_ms) VALUES "+strings.Join(ledger, ","))
		} else {
			// Lost booking: the first order of the hour never booked.
			// Double booking: the second booked again a second later.
			dbl := strings.Replace(ledger[1], fmt.Sprint(at+5000+1), fmt.Sprint(at+6000+1), 1)
			// Orphan: a booking of an order no token was issued for.
			ghost := fmt.Sprintf("('u9_rain_ghost', 'u9', 'GRANT', 7, 'spring-live', 'rain', 0, %d, %d)", at+7000, at)
			exec(t, "INSERT INTO ledger (order_no, act_id, kind, amount, activity_id, scene_id, balance_after, booked_at_ms, granted_at_ms) VALUES "+strings.Join(append(ledger[1:], dbl, ghost), ","))
		}
		// A push job per hour: 50 targets after filtering.
		job := fmt.Sprintf("job-%d", h.Hour())
		exec(t, fmt.Sprintf(`INSERT INTO job_states (job_id, from_state, to_state, reason, executor, position, targets, at_ms) VALUES
			('%s', 'FILTERING', 'QUEUED', '', '', 0, 50, %d), ('%s', 'SENDING', 'COMPLETED', '', '', 1, 50, %d)`, job, at, job, at+100))
		var del []string
		n := 50
		if h == base.Add(time.Hour) {
			n = 49 // one target never delivered nor queued
		}
		for u := range n {
			status := "DELIVERED"
			if u%5 == 0 {
				status = "QUEUED_OFFLINE"
			}
			del = append(del, fmt.Sprintf("('%s', %d, '%s', '', 0, 0, %d)", job, u+1, status, at))
		}
		del = append(del, fmt.Sprintf("('%s', 5, 'DELIVERED_ON_LOGIN', '', 0, 0, %d)", job, at+50)) // queued, then delivered: one target
		exec(t, "INSERT INTO deliveries (job_id, uin, status, filter, unit_id, display_at_ms, at_ms) VALUES "+strings.Join(del, ","))
	}

	r := recon.New(recon.Config{Env: streams.Env{Now: func() time.Time { return base.Add(3 * time.Hour) }}, Store: store})
	ctx := context.Background()
	res, bad, err := r.Run(ctx, recon.Hour(base, recon.AttemptH1))
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 || len(res) < 3 {
		for _, x := range res {
			t.Log(x)
		}
		t.Fatalf("clean hour: %d mismatches in %d results", bad, len(res))
	}
	res, bad, err = r.Run(ctx, recon.Hour(base.Add(time.Hour), recon.AttemptH1))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, x := range res {
		if x.Mismatch {
			found = append(found, x.Check+": "+x.Scope)
		}
	}
	all := strings.Join(found, "\n")
	for _, want := range []string{
		"granted_vs_booked: activity=spring-live scene=rain grants=100 lost=1 doubled=1",
		"granted_vs_booked: user=u0", // the lost booking's user is underpaid
		"granted_vs_booked: user=u1", // the doubled booking's user is overpaid
		"granted_vs_booked: user=u9", // the orphan booking's user is paid what was never granted
		"tokens_vs_ledger: activity=spring-live scene=rain tokens=100 unbooked=1",
		"tokens_vs_ledger: activity=spring-live scene=rain entries without a token=1",
		"targets_vs_deliveries: job=job-11",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("not found: %q\nmismatches:\n%s", want, all)
		}
	}
	if bad != len(found) || bad < 7 {
		t.Fatalf("%d mismatches", bad)
	}
	res, badOffsetting, err := r.Run(ctx, recon.Hour(offsetting, recon.AttemptH1))
	if err != nil {
		t.Fatal(err)
	}
	found = found[:0]
	for _, x := range res {
		if x.Mismatch {
			found = append(found, fmt.Sprintf("%s: %s %d/%d", x.Check, x.Scope, x.Expected, x.Actual))
		}
	}
	if want := []string{"granted_vs_booked: user=u2 %d/%d", "granted_vs_booked: user=u3 %d/%d"}; len(found) != 2 ||
		!slices.Contains(found, fmt.Sprintf(want[0], 570, 575)) || !slices.Contains(found, fmt.Sprintf(want[1], 580, 575)) {
		t.Fatalf("offsetting bookings: mismatches %q, want users u2 (570 granted, 575 booked) and u3 (580, 575)", found)
	}
	// Results are in the table, for the report.
	// (Its own hours: other tests of the package write results too.)
	rows, err := store.QueryStrings(ctx, fmt.Sprintf("SELECT count(), sum(mismatch) FROM recon_results FINAL WHERE hour_start_ms >= %d AND hour_start_ms < %d",
		base.UnixMilli(), base.Add(3*time.Hour).UnixMilli()))
	if err != nil || rows[0][1] != fmt.Sprint(bad+badOffsetting) {
		t.Fatalf("recon_results: %v %v", rows, err)
	}
}

func TestReport(t *testing.T) {
	TestFindsLostDoubleAndUndelivered(t) // fills the tables and results
	rep, err := recon.BuildReport(context.Background(), store, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Hours) < 6 || len(rep.Open) < 5 {
		t.Fatalf("report: %d hour rows, %d open", len(rep.Hours), len(rep.Open))
	}
	// Three hours of 100 grants of 10..109 cents (5950 each). The second
	// lost the 10-cent booking, paid the 11-cent one twice and paid a
	// 7-cent order never granted; one of its 50 targets was not reached.
	want := recon.Totals{Grants: 300, GrantedCash: 3 * 5950, Booked: 3*5950 - 10 + 11 + 7, Lost: 1, Doubled: 1, Unbooked: 1,
		JobsComplete: 3, Targets: 150, Reached: 149}
	if rep.Totals != want {
		t.Fatalf("totals %+v, want %+v", rep.Totals, want)
	}
	var text, js strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2026-12-01 10:00  granted_vs_booked", "MISMATCH", "open mismatches:", "lost=1 doubled=1",
		"totals of these hours: 300 cash grants, 17850 cents granted, 17858 cents booked (1 lost, 1 doubled, 1 tokens unbooked); 3 push jobs completed, 150 targets, 149 reached"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if !strings.Contains(js.String(), `"open_mismatches"`) {
		t.Fatalf("json: %s", js.String())
	}
	t.Log("\n" + text.String())
}

// The reconciliation finds the same results through the server driver
// (clickhouse-go over HTTP, served by chdbhttp on this test's database) as
// through chDB in-process: every check, scope and sum of the three hours.
func TestServerDriverReconcilesAlike(t *testing.T) {
	TestFindsLostDoubleAndUndelivered(t) // fills the tables
	ctx := context.Background()
	ep, err := chdbhttp.Listen(store.(*clickhouse.ChDB), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	server, err := clickhouse.OpenServer(ctx, ep.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := func() time.Time { return base.Add(3 * time.Hour) }
	results := func(st clickhouse.Store, h time.Time) []string {
		res, _, err := recon.New(recon.Config{Env: streams.Env{Now: now}, Store: st}).Run(ctx, recon.Hour(h, recon.AttemptH1))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range res {
			out = append(out, fmt.Sprintf("%s %s %d/%d mismatch=%v", x.Check, x.Scope, x.Expected, x.Actual, x.Mismatch))
		}
		slices.Sort(out)
		return out
	}
	mismatches := 0
	for h := range 3 {
		hour := base.Add(time.Duration(h) * time.Hour)
		embedded, viaServer := results(store, hour), results(server, hour)
		if len(embedded) == 0 || !slices.Equal(embedded, viaServer) {
			t.Fatalf("hour %s:\nchdb:\n%s\nserver:\n%s", hour.Format("15:04"), strings.Join(embedded, "\n"), strings.Join(viaServer, "\n"))
		}
		for _, r := range viaServer {
			if strings.HasSuffix(r, "mismatch=true") {
				mismatches++
			}
		}
	}
	if mismatches < 9 { // 7 in the faulty hour, 2 in the offsetting one
		t.Fatalf("%d mismatches found through both drivers", mismatches)
	}
}
