package recycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/cockroachdb/datadriven"
	"github.com/redis/go-redis/v9"

	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// epoch is the scripts' time zero: times in testdata are offsets from it.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestTicketDataDriven runs testdata/tickets: recycle requests and usage
// fed to the controller's step logic, one committed batch each (effects
// in Redis applied before the commit), and what it emitted or refused.
// Commands (times are offsets from epoch):
//
//	account uin=N username=U           an account's core data in Redis
//	clock at=T                         the controller's clock
//	grant uin=N category=C last-login=T [username=U]
//	request uin=N step=KIND prev=KIND [ticket=ID]  (default: the uin's ticket)
//	batch-grant uins=(N,M,..) category=C last-login=T [partition=P]
//	batch uins=(N,M,..) step=KIND prev=KIND [partition=P]  (each uin's ticket)
//	partitions n=N                     of uin.recycle-requests (default 1)
//	usage uin=N kind=K at=T [source=S]
//	state uin=N
//	pooled uin=N                       whether the uin is free in the central pool
//	banned uin=N                       whether the account is banned, how much longer, why
//
// Regenerate the expected output with -rewrite.
func TestTicketDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		ctx := context.Background()
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		mr := miniredis.RunT(t)
		mr.SetTime(epoch) // TTLs (bans) count on the scripts' clock
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		accounts, central := account.NewStore(rdb, uinkeys.Prefix("dd.")), pool.NewCentral(rdb, uinkeys.Pool("dd."), 16)
		if err := central.Restore(context.Background(), pool.NewFold(16), nil); err != nil { // an empty pool
			t.Fatal(err)
		}
		db, err := openDB(t.TempDir(), quiet)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		now := epoch
		c := New(Config{Env: streams.Env{Namespace: "dd.", Now: func() time.Time { return now }, Log: quiet}, Accounts: accounts, Pool: central})
		c.committed = newCommitted(db, 2) // few states in memory: the scripts' lookups go to Pebble too
		c.staged, c.restored = newStore(c.committed), newStore(c.committed)
		c.partitions = 1

		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			offset := func(key string) int64 {
				var s string
				d.ScanArgs(t, key, &s)
				off, err := time.ParseDuration(strings.TrimPrefix(s, "+"))
				if err != nil {
					d.Fatalf(t, "%s=%s: %v", key, s, err)
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
			kind := func(key string) pb.RecycleStepKind {
				v, ok := pb.RecycleStepKind_value[str(key)]
				if !ok {
					d.Fatalf(t, "%s: unknown step %q", key, str(key))
				}
				return pb.RecycleStepKind(v)
			}
			var uin uint64
			if d.HasArg("uin") {
				d.ScanArgs(t, "uin", &uin)
			}
			out := &streams.Output{}
			s := &step{c: c, ctx: ctx, out: out, now: now}
			var err error
			switch d.Cmd {
			case "account":
				if err := accounts.Create(ctx, account.Account{Uin: uint32(uin), Username: str("username"), Profile: map[string]string{"nick": str("username")}}); err != nil {
					return err.Error() + "\n"
				}
				return "ok\n"
			case "clock":
				next := time.UnixMilli(offset("at")).UTC()
				mr.FastForward(next.Sub(now)) // TTLs run out on the scripts' clock
				now = next
				mr.SetTime(now)
				return "now +" + now.Sub(epoch).String() + "\n"
			case "grant":
				f := recycling.Finding{Uin: uint32(uin), Category: str("category"), Username: str("username"), Reason: "scripted", LastLoginMs: offset("last-login")}
				if d.HasArg("registered") {
					f.RegisteredAtMs = offset("registered")
				}
				err = s.request(recycling.Grant(f, now))
			case "request":
				ticket := str("ticket")
				if ticket == "" {
					if cur, _ := c.staged.state(uint32(uin)); cur != nil {
						ticket = cur.TicketId
					}
				}
				err = s.request(&pb.RecycleStep{Uin: uin, TicketId: ticket, Step: kind("step"), ExpectedPrev: kind("prev")})
			case "partitions":
				d.ScanArgs(t, "n", &c.partitions)
				return fmt.Sprintf("%d partitions\n", c.partitions)
			case "batch-grant", "batch":
				var uins []int
				d.ScanArgs(t, "uins", &uins)
				req := &pb.RecycleStep{}
				for _, u := range uins {
					if d.Cmd == "batch-grant" {
						req.Batch = append(req.Batch, recycling.Grant(recycling.Finding{Uin: uint32(u), Category: str("category"), Reason: "scripted", LastLoginMs: offset("last-login")}, now))
						continue
					}
					e := &pb.RecycleStep{Uin: uint64(u), Step: kind("step"), ExpectedPrev: kind("prev")}
					if cur, _ := c.staged.state(uint32(u)); cur != nil {
						e.TicketId = cur.TicketId
					}
					req.Batch = append(req.Batch, e)
				}
				partition := int32(streams.PartitionFor(schemas.UinKey(uint32(uins[0])), c.partitions))
				if d.HasArg("partition") {
					d.ScanArgs(t, "partition", &partition)
				}
				err = s.record(partition, req)
			case "usage":
				err = s.usage(&pb.UsageEvent{Uin: uin, Kind: str("kind"), Source: str("source"), AtMs: offset("at")})
			case "state":
				cur, err := c.staged.state(uint32(uin))
				switch {
				case err != nil:
					return err.Error() + "\n"
				case cur == nil:
					return "no ticket\n"
				}
				rec, _ := streams.NewRecord("uin.recycle-steps", nil, cur)
				_, fields, _ := strings.Cut(streamstest.Describe(rec, "", epoch), ":")
				return strings.TrimSpace(fields) + "\n"
			case "banned":
				banned, left, why, err := accounts.Banned(ctx, uint32(uin))
				switch {
				case err != nil:
					return err.Error() + "\n"
				case !banned:
					return "not banned\n"
				}
				return fmt.Sprintf("banned for %s: %s\n", left, why)
			case "pooled":
				used, err := central.InUse(ctx, uint32(uin))
				if err != nil {
					return err.Error() + "\n"
				}
				if used {
					return "in use\n"
				}
				return "free\n"
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			if err == nil {
				err = s.flush()
			}
			if err == nil {
				err = c.applyEffects(ctx)
			}
			c.batchEnd(err == nil)
			return render(err, out, now)
		})
	})
}

// render is a step's answer: its refusal, or the records it emitted.
func render(err error, out *streams.Output, now time.Time) string {
	var b strings.Builder
	if re := (*streams.RejectError)(nil); errors.As(err, &re) && re.Keep {
		b.WriteString("refused, the rest kept: " + err.Error() + "\n")
	} else if err != nil {
		return "refused: " + err.Error() + "\n"
	}
	if out.Len() == 0 {
		return b.String() + "(nothing)\n"
	}
	for _, r := range out.Records() {
		b.WriteString(streamstest.Describe(r, "dd.", epoch) + "\n")
	}
	return b.String()
}
