package clickhouse

import (
	"fmt"
	"surge/processors/wallet/token"
	"surge/schemas/uinset"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
)

// Grants sinks wallet.grants.
func Grants() *Sink {
	return fieldSink("sink-grants", schemas.TopicGrants, "grants", &pb.RewardGrant{},
		"order_no String, act_id String, activity_id String, parent_activity_id String, scene_id String, award_type String, amount Int64, at_ms Int64",
		"order_no", "act_id", "activity_id", "parent_activity_id", "scene_id", "award_type", "amount", "at_ms")
}

// CashGrants sinks into the grants table the cash grants, which ride
// inside their tokens on wallet.tokens (Token.grant: one record per cash
// grant, not two); sink-grants writes the others from wallet.grants. A
// token without a grant (an earlier build's, whose grant went to
// wallet.grants) gives no row.
func CashGrants() *Sink {
	grants := Grants()
	rows := newWireRows(grants.Message, grants.Columns, grants.Fields...)
	tokenSchema := schemas.Of(&pb.Token{})
	return &Sink{Name: "sink-cash-grants", Topic: schemas.TopicTokens, Table: grants.Table, Columns: grants.Columns,
		Write: func(r *kgo.Record, w *RowWriter) error {
			if err := streams.CheckSchema(r, tokenSchema); err != nil {
				return err
			}
			g, found, err := token.GrantOf(r.Value)
			if err != nil {
				return streams.Reject("malformed "+tokenSchema.Name, err)
			}
			if !found {
				return nil
			}
			return rows.writeValue(g, w)
		}}
}

// Tokens sinks wallet.tokens: one row per token issued (PROCESSING); a
// token's booking is its row in ledger. Rows of SUCCESS tokens written by
// earlier builds are kept as they came.
func Tokens() *Sink {
	return fieldSink("sink-tokens", schemas.TopicTokens, "tokens", &pb.Token{},
		"order_no String, act_id String, activity_id String, scene_id String, amount Int64, status String, open_time Int64",
		"out_trade_no", "act_id", "activity_id", "scene_id", "amount", "status", "open_time")
}

// Ledger sinks wallet.ledger.
func Ledger() *Sink {
	return fieldSink("sink-ledger", schemas.TopicLedger, "ledger", &pb.LedgerEntry{},
		"order_no String, act_id String, kind String, amount Int64, activity_id String, scene_id String, balance_after Int64, booked_at_ms Int64, granted_at_ms Int64",
		"order_no", "act_id", "kind", "amount", "activity_id", "scene_id", "balance_after", "booked_at_ms", "granted_at_ms")
}

// Withdrawals sinks the ledger's answers to withdrawals.
func Withdrawals() *Sink {
	return fieldSink("sink-withdrawals", schemas.TopicWithdrawResult, "withdrawals", &pb.Withdrawal{},
		"withdraw_id String, act_id String, amount Int64, refused UInt8, reason String, balance_after Int64, at_ms Int64",
		"withdraw_id", "act_id", "amount", "refused", "reason", "balance_after", "at_ms")
}

// JobStates sinks push.job-transitions.
func JobStates() *Sink {
	return &Sink{Name: "sink-job-states", Topic: schemas.TopicJobTransitions, Table: "job_states",
		Columns: Columns("job_id String, from_state String, to_state String, reason String, executor String, position UInt64, targets UInt64, at_ms Int64"),
		// Decoded whole: the transition carries the job, a nested message.
		Write: func(r *kgo.Record, w *RowWriter) error {
			var t pb.JobTransition
			if err := streams.Decode(r, &t); err != nil {
				return err
			}
			w.Str(t.JobId)
			w.Str(t.From.String())
			w.Str(t.To.String())
			w.Str(t.Reason)
			w.Str(t.Executor)
			w.U64(t.Position)
			w.U64(t.Targets)
			w.I64(t.AtMs)
			w.EndRow()
			return nil
		}}
}

// Deliveries sinks push.reports, one row per target.
func Deliveries() *Sink {
	return &Sink{Name: "sink-deliveries", Topic: schemas.TopicReports, Table: "deliveries",
		Columns: Columns("job_id String, uin UInt32, status String, filter String, unit_id UInt32, display_at_ms Int64, at_ms Int64"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			var rep pb.DeliveryReport
			if err := streams.Decode(r, &rep); err != nil {
				return err
			}
			set := roaring.New()
			if len(rep.Uins) > 0 {
				var err error
				if set, err = uinset.Decode(rep.Uins); err != nil {
					return streams.Reject("report with unreadable uins", err)
				}
			} else {
				set.Add(uint32(rep.Uin))
			}
			status := rep.Status.String()
			it := set.Iterator()
			for it.HasNext() {
				w.Str(rep.JobId)
				w.U32(it.Next())
				w.Str(status)
				w.Str(rep.Filter)
				w.U32(rep.UnitId)
				w.I64(rep.DisplayAtMs)
				w.I64(rep.AtMs)
				w.EndRow()
			}
			return nil
		}}
}

// RecycleSteps sinks uin.recycle-steps.
func RecycleSteps() *Sink {
	return &Sink{Name: "sink-recycle-steps", Topic: schemas.TopicRecycleSteps, Table: "recycle_steps",
		Columns: Columns("uin UInt32, ticket_id String, step String, expected_prev String, category String, reason String, at_ms Int64"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			entries, err := recycling.Decode(r) // a row per ticket of a batch
			if err != nil {
				return err
			}
			for _, s := range entries {
				if err := checkUin(s.Uin); err != nil {
					return err
				}
			}
			for _, s := range entries {
				w.U32(uint32(s.Uin))
				w.Str(s.TicketId)
				w.Str(s.Step.String())
				w.Str(s.ExpectedPrev.String())
				w.Str(s.Category)
				w.Str(s.Reason)
				w.I64(s.AtMs)
				w.EndRow()
			}
			return nil
		}}
}

func checkUin(u uint64) error {
	if u == 0 || u > 1<<32-1 {
		return streams.Reject(fmt.Sprintf("uin out of range: %d", u), nil)
	}
	return nil
}

// UinRegistrations sinks uin.registrations.
func UinRegistrations() *Sink {
	return &Sink{Name: "sink-uin-registrations", Topic: schemas.TopicRegistrations, Table: "uin_registrations",
		Columns: Columns("uin UInt32, username String, channel String, completed UInt8, at_ms Int64"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			var g pb.UinRegistration
			if err := streams.Decode(r, &g); err != nil {
				return err
			}
			if err := checkUin(g.Uin); err != nil {
				return err
			}
			w.U32(uint32(g.Uin))
			w.Str(g.Username)
			w.Str(g.Channel)
			w.Bool(g.Completed)
			w.I64(g.AtMs)
			w.EndRow()
			return nil
		}}
}

// UinUsage sinks uin.usage.
func UinUsage() *Sink {
	return &Sink{Name: "sink-uin-usage", Topic: schemas.TopicUsage, Table: "uin_usage",
		Columns: Columns("uin UInt32, kind String, source String, at_ms Int64"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			var u pb.UsageEvent
			if err := streams.Decode(r, &u); err != nil {
				return err
			}
			if err := checkUin(u.Uin); err != nil {
				return err
			}
			w.U32(uint32(u.Uin))
			w.Str(u.Kind)
			w.Str(u.Source)
			w.I64(u.AtMs)
			w.EndRow()
			return nil
		}}
}

// Recon sinks platform.recon.
func Recon() *Sink {
	return &Sink{Name: "sink-recon", Topic: schemas.TopicRecon, Table: "recon_results",
		Columns: Columns("check_name String, hour_start_ms Int64, scope String, expected Int64, actual Int64, mismatch UInt8, attempt String, run_at_ms Int64"),
		Write: func(r *kgo.Record, w *RowWriter) error {
			var x pb.ReconResult
			if err := streams.Decode(r, &x); err != nil {
				return err
			}
			WriteRecon(w, &x)
			return nil
		}}
}

// WriteRecon appends one result row of the recon_results table.
func WriteRecon(w *RowWriter, x *pb.ReconResult) {
	w.Str(x.Check)
	w.I64(x.HourStartMs)
	w.Str(x.Scope)
	w.I64(x.Expected)
	w.I64(x.Actual)
	w.Bool(x.Mismatch)
	w.Str(x.Attempt)
	w.I64(x.RunAtMs)
	w.EndRow()
}

// Facts is every fact sink, by name.
func Facts() []*Sink {
	return []*Sink{DeadLetters(), Presence(), Grants(), CashGrants(), Tokens(), Ledger(), Withdrawals(), JobStates(), Deliveries(), RecycleSteps(), UinRegistrations(), UinUsage(), Recon()}
}
