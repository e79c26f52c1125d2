package tracker

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/localstore"
	"surge/streams/streamstest"
)

// epoch is the scripts' time zero: times in testdata are offsets from it.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestTrackerDataDriven runs testdata/tracking: records fed to the
// tracker's handlers, one committed batch each, and what it emitted (its
// changelog, timers, recycle requests) or why it refused the record.
// Commands (times are offsets from epoch: at=+1h):
//
//	register uin=N at=T [completed] [username=U] [channel=C] [offset=O]
//	usage uin=N kind=K at=T [offset=O]   (offset: the record's in its topic)
//	check uin=N checkpoint=I          the timer of checkpoint I fired
//	step uin=N step=KIND at=T         a recycle step applied (uin.recycle-steps)
//	step uins=(N,M,..) step=KIND at=T  the same step of many tickets, in one batch
//	state uin=N
//
// Regenerate the expected output with -rewrite.
func TestTrackerDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		db, err := localstore.Open(t.TempDir(), true, quiet)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		tr := New(Config{Env: streams.Env{Namespace: "dd.", Now: func() time.Time { return epoch }, Log: quiet}})
		tr.db, tr.staged = db, db.NewIndexedBatch()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var uin uint64
			if d.HasArg("uin") {
				d.ScanArgs(t, "uin", &uin)
			}
			at := func() int64 {
				var s string
				d.ScanArgs(t, "at", &s)
				off, err := time.ParseDuration(strings.TrimPrefix(s, "+"))
				if err != nil {
					d.Fatalf(t, "at=%s: %v", s, err)
				}
				return epoch.Add(off).UnixMilli()
			}
			str := func(key string) string {
				var s string
				if d.HasArg(key) {
					d.ScanArgs(t, key, &s)
				}
				return s
			}
			offset := int64(-1) // none: not made idempotent
			if d.HasArg("offset") {
				d.ScanArgs(t, "offset", &offset)
			}
			out := &streams.Output{}
			var err error
			switch d.Cmd {
			case "register":
				err = tr.register(&pb.UinRegistration{Uin: uin, AtMs: at(), Completed: d.HasArg("completed"),
					Username: str("username"), Channel: str("channel")}, offset, out)
			case "usage":
				_, err = tr.usage(&pb.UsageEvent{Uin: uin, Kind: str("kind"), AtMs: at()}, offset, out)
			case "check":
				var idx int
				d.ScanArgs(t, "checkpoint", &idx)
				var registered int64 // the checkpoint's registration: the tracked one's
				if cur, gerr := get(tr.staged, uint32(uin)); gerr != nil {
					return gerr.Error() + "\n"
				} else if cur != nil {
					registered = cur.RegisteredAtMs
				}
				err = tr.check(&pb.RegistrationCheck{Uin: uin, Checkpoint: int32(idx), RegisteredAtMs: registered}, out)
			case "step":
				kind, ok := pb.RecycleStepKind_value[str("step")]
				if !ok {
					d.Fatalf(t, "unknown step %q", str("step"))
				}
				rec := &pb.RecycleStep{Uin: uin, Step: pb.RecycleStepKind(kind), AtMs: at()}
				if d.HasArg("uins") {
					var uins []uint64
					d.ScanArgs(t, "uins", &uins)
					rec = &pb.RecycleStep{}
					for _, u := range uins {
						rec.Batch = append(rec.Batch, &pb.RecycleStep{Uin: u, Step: pb.RecycleStepKind(kind), AtMs: at()})
					}
				}
				err = tr.recycledSteps(recycling.Entries(rec), out)
			case "state":
				cur, err := get(tr.staged, uint32(uin))
				switch {
				case err != nil:
					return err.Error() + "\n"
				case cur == nil:
					return "not tracked\n"
				}
				rec, _ := streams.NewRecord("uin.tracking", nil, cur)
				_, fields, _ := strings.Cut(streamstest.Describe(rec, "", epoch), ":")
				return strings.TrimSpace(fields) + "\n"
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			tr.batchEnd(err == nil)
			return render(err, out.Records(), "dd.")
		})
	})
}

// render is a handler's answer: its refusal, or the records it emitted.
func render(err error, recs []*kgo.Record, ns string) string {
	if err != nil {
		return "refused: " + err.Error() + "\n"
	}
	if len(recs) == 0 {
		return "(nothing)\n"
	}
	var b strings.Builder
	for _, r := range recs {
		b.WriteString(streamstest.Describe(r, ns, epoch) + "\n")
	}
	return b.String()
}
