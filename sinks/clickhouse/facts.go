package clickhouse

import (
	"fmt"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Grants sinks wallet.grants.
func Grants() *Sink {
	return &Sink{Name: "sink-grants", Topic: schemas.TopicGrants, Table: "grants",
		Columns: []string{"order_no", "act_id", "activity_id", "parent_activity_id", "scene_id", "award_type", "amount", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var g pb.RewardGrant
			if err := streams.Decode(r, &g); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%s, %s, %s, %s, %s, %s, %d, %d)", Quote(g.OrderNo), Quote(g.ActId), Quote(g.ActivityId),
				Quote(g.ParentActivityId), Quote(g.SceneId), Quote(g.AwardType.String()), g.Amount, g.AtMs), nil
		}}
}

// Tokens sinks wallet.tokens (each status a row).
func Tokens() *Sink {
	return &Sink{Name: "sink-tokens", Topic: schemas.TopicTokens, Table: "tokens",
		Columns: []string{"order_no", "act_id", "activity_id", "scene_id", "amount", "status", "open_time"},
		Row: func(r *kgo.Record) (string, error) {
			var t pb.Token
			if err := streams.Decode(r, &t); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%s, %s, %s, %s, %d, %s, %d)", Quote(t.OutTradeNo), Quote(t.ActId), Quote(t.ActivityId),
				Quote(t.SceneId), t.Amount, Quote(t.Status.String()), t.OpenTime), nil
		}}
}

// Ledger sinks wallet.ledger.
func Ledger() *Sink {
	return &Sink{Name: "sink-ledger", Topic: schemas.TopicLedger, Table: "ledger",
		Columns: []string{"order_no", "act_id", "kind", "amount", "activity_id", "scene_id", "balance_after", "booked_at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var e pb.LedgerEntry
			if err := streams.Decode(r, &e); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%s, %s, %s, %d, %s, %s, %d, %d)", Quote(e.OrderNo), Quote(e.ActId), Quote(e.Kind.String()),
				e.Amount, Quote(e.ActivityId), Quote(e.SceneId), e.BalanceAfter, e.BookedAtMs), nil
		}}
}

// Withdrawals sinks the ledger's answers to withdrawals.
func Withdrawals() *Sink {
	return &Sink{Name: "sink-withdrawals", Topic: schemas.TopicWithdrawResult, Table: "withdrawals",
		Columns: []string{"withdraw_id", "act_id", "amount", "refused", "reason", "balance_after", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var w pb.Withdrawal
			if err := streams.Decode(r, &w); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%s, %s, %d, %d, %s, %d, %d)", Quote(w.WithdrawId), Quote(w.ActId), w.Amount, b2i(w.Refused),
				Quote(w.Reason), w.BalanceAfter, w.AtMs), nil
		}}
}

// JobStates sinks push.job-transitions.
func JobStates() *Sink {
	return &Sink{Name: "sink-job-states", Topic: schemas.TopicJobTransitions, Table: "job_states",
		Columns: []string{"job_id", "from_state", "to_state", "reason", "executor", "position", "targets", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var t pb.JobTransition
			if err := streams.Decode(r, &t); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%s, %s, %s, %s, %s, %d, %d, %d)", Quote(t.JobId), Quote(t.From.String()), Quote(t.To.String()),
				Quote(t.Reason), Quote(t.Executor), t.Position, t.Targets, t.AtMs), nil
		}}
}

// Deliveries sinks push.reports, one row per target.
func Deliveries() *Sink {
	return &Sink{Name: "sink-deliveries", Topic: schemas.TopicReports, Table: "deliveries",
		Columns: []string{"job_id", "uin", "status", "filter", "unit_id", "display_at_ms", "at_ms"},
		Rows: func(r *kgo.Record) ([]string, error) {
			var rep pb.DeliveryReport
			if err := streams.Decode(r, &rep); err != nil {
				return nil, err
			}
			set := roaring.New()
			if len(rep.Uins) > 0 {
				if err := set.UnmarshalBinary(rep.Uins); err != nil {
					return nil, streams.Reject("report with unreadable uins", err)
				}
			} else {
				set.Add(uint32(rep.Uin))
			}
			prefix := fmt.Sprintf("(%s, ", Quote(rep.JobId))
			suffix := fmt.Sprintf(", %s, %s, %d, %d, %d)", Quote(rep.Status.String()), Quote(rep.Filter), rep.UnitId, rep.DisplayAtMs, rep.AtMs)
			rows := make([]string, 0, set.GetCardinality())
			it := set.Iterator()
			for it.HasNext() {
				rows = append(rows, fmt.Sprintf("%s%d%s", prefix, it.Next(), suffix))
			}
			return rows, nil
		}}
}

// RecycleSteps sinks uin.recycle-steps.
func RecycleSteps() *Sink {
	return &Sink{Name: "sink-recycle-steps", Topic: schemas.TopicRecycleSteps, Table: "recycle_steps",
		Columns: []string{"uin", "ticket_id", "step", "expected_prev", "category", "reason", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var s pb.RecycleStep
			if err := streams.Decode(r, &s); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%d, %s, %s, %s, %s, %s, %d)", s.Uin, Quote(s.TicketId), Quote(s.Step.String()),
				Quote(s.ExpectedPrev.String()), Quote(s.Category), Quote(s.Reason), s.AtMs), nil
		}}
}

// UinRegistrations sinks uin.registrations.
func UinRegistrations() *Sink {
	return &Sink{Name: "sink-uin-registrations", Topic: schemas.TopicRegistrations, Table: "uin_registrations",
		Columns: []string{"uin", "username", "channel", "completed", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var g pb.UinRegistration
			if err := streams.Decode(r, &g); err != nil {
				return "", err
			}
			if g.Uin == 0 || g.Uin > 1<<32-1 {
				return "", streams.Reject(fmt.Sprintf("uin out of range: %d", g.Uin), nil)
			}
			return fmt.Sprintf("(%d, %s, %s, %d, %d)", g.Uin, Quote(g.Username), Quote(g.Channel), b2i(g.Completed), g.AtMs), nil
		}}
}

// UinUsage sinks uin.usage.
func UinUsage() *Sink {
	return &Sink{Name: "sink-uin-usage", Topic: schemas.TopicUsage, Table: "uin_usage",
		Columns: []string{"uin", "kind", "source", "at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var u pb.UsageEvent
			if err := streams.Decode(r, &u); err != nil {
				return "", err
			}
			if u.Uin == 0 || u.Uin > 1<<32-1 {
				return "", streams.Reject(fmt.Sprintf("uin out of range: %d", u.Uin), nil)
			}
			return fmt.Sprintf("(%d, %s, %s, %d)", u.Uin, Quote(u.Kind), Quote(u.Source), u.AtMs), nil
		}}
}

// Recon sinks platform.recon.
func Recon() *Sink {
	return &Sink{Name: "sink-recon", Topic: schemas.TopicRecon, Table: "recon_results",
		Columns: []string{"check_name", "hour_start_ms", "scope", "expected", "actual", "mismatch", "attempt", "run_at_ms"},
		Row: func(r *kgo.Record) (string, error) {
			var x pb.ReconResult
			if err := streams.Decode(r, &x); err != nil {
				return "", err
			}
			return fmt.Sprintf("(%s, %d, %s, %d, %d, %d, %s, %d)", Quote(x.Check), x.HourStartMs, Quote(x.Scope), x.Expected,
				x.Actual, b2i(x.Mismatch), Quote(x.Attempt), x.RunAtMs), nil
		}}
}

// Facts is every fact sink, by name.
func Facts() []*Sink {
	return []*Sink{DeadLetters(), Presence(), Grants(), Tokens(), Ledger(), Withdrawals(), JobStates(), Deliveries(), RecycleSteps(), UinRegistrations(), UinUsage(), Recon()}
}
