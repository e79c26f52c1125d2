package classify_test

import (
	"context"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/uin/app"
	"surge/processors/uin/classify"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/streams"
	"surge/streams/streamstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func rec(t *testing.T, topic string, uin uint32, m proto.Message) *kgo.Record {
	r, err := streams.NewRecord(topic, schemas.UinKey(uin), m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func waitRows(t *testing.T, st clickhouse.Store, table string, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows, err := st.QueryStrings(context.Background(), "SELECT count() FROM "+table)
		if err == nil && rows[0][0] == strconv.Itoa(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v rows, want %d (%v)", table, rows, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStockClassification feeds registrations and usage through the sinks
// into chDB, classifies the stock, and checks the groups, the final online
// check and the controller's second look at the last login.
func TestStockClassification(t *testing.T) {
	st, err := clickhouse.OpenChDB("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	if _, err := clickhouse.Migrate(ctx, st); err != nil {
		t.Fatal(err)
	}
	// In turn: the backends share one ClickHouse table set.
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		for _, table := range []string{"uin_registrations", "uin_usage"} {
			if err := st.Exec(ctx, "TRUNCATE TABLE "+table); err != nil {
				t.Fatal(err)
			}
		}
		s := app.New(b.Kafka, rdb, app.Options{Namespace: streamstest.Unique("c") + ".", Dir: t.TempDir(), Log: quiet})
		ns := s.Opts.Namespace
		if err := s.CreateTopics(ctx, streams.OneCopy); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		ago := func(d int) int64 { return now.Add(-time.Duration(d) * 24 * time.Hour).UnixMilli() }
		var recs []*kgo.Record
		regd := func(uin uint32, completed bool, at int64) {
			recs = append(recs, rec(t, ns+schemas.TopicRegistrations, uin, &pb.UinRegistration{Uin: uint64(uin), Username: "u" + strconv.Itoa(int(uin)), Completed: completed, AtMs: at}))
		}
		login := func(uin uint32, source string, at int64) {
			recs = append(recs, rec(t, ns+schemas.TopicUsage, uin, &pb.UsageEvent{Uin: uint64(uin), Kind: recycling.KindLogin, Source: source, AtMs: at}))
		}
		regd(7001, false, ago(200)) // never completed
		regd(7002, true, ago(200))  // never logged in
		regd(7003, true, ago(400))  // inactive by both sources
		login(7003, "auth", ago(300))
		login(7003, "device", ago(250))
		regd(7004, true, ago(400)) // auth stale, device recent: active
		login(7004, "auth", ago(300))
		login(7004, "device", ago(10))
		regd(7005, true, ago(400)) // active
		login(7005, "auth", ago(5))
		regd(7006, true, ago(400)) // inactive but online right now
		login(7006, "auth", ago(300))
		regd(7007, true, ago(400)) // inactive in ClickHouse; logs in after the snapshot
		login(7007, "auth", ago(300))
		regd(7008, true, ago(30))   // too young: the registration checks' own
		regd(7009, false, ago(200)) // never completed, but logged in since (a stopped ticket): not abandoned
		login(7009, "auth", ago(100))
		cl := streamstest.Client(t, b.Kafka)
		streamstest.ProduceSync(t, cl, recs...)

		sctx, stopSinks := context.WithCancel(ctx)
		for _, sk := range []*clickhouse.Sink{clickhouse.UinRegistrations(), clickhouse.UinUsage()} {
			sk.Topic = ns + sk.Topic
			sk.Bind(st)
			go func() {
				_ = sk.Run(sctx, b.Kafka, streams.Group(ns+sk.Name), streams.Logger(quiet),
					streams.DeadLetterTopic(ns+schemas.TopicDeadLetter))
			}()
		}
		waitRows(t, st, "uin_registrations", 9)
		waitRows(t, st, "uin_usage", 8)
		stopSinks()

		cctx, stop := context.WithCancel(ctx)
		c := s.StartController(cctx, 0)
		t.Cleanup(func() { stop(); _ = s.Wait() })
		// 7007 logs in now: only the controller's live index sees it.
		streamstest.ProduceSync(t, cl, rec(t, ns+schemas.TopicUsage, 7007,
			&pb.UsageEvent{Uin: 7007, Kind: recycling.KindLogin, Source: "device", AtMs: now.UnixMilli()}))
		deadline := time.Now().Add(30 * time.Second)
		for {
			l, err := c.LastLogin(7007)
			if err == nil && l.Device == now.UnixMilli() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("controller never saw 7007's login: %v %v", l, err)
			}
			time.Sleep(50 * time.Millisecond)
		}

		rep, err := classify.Run(ctx, st, cl, classify.Options{Namespace: ns, Now: func() time.Time { return now }, Log: quiet,
			Online: func(_ context.Context, uin uint32) (bool, error) { return uin == 7006, nil }})
		if err != nil {
			t.Fatal(err)
		}
		wantGroups := map[string]int{classify.GroupNeverCompleted: 1, classify.GroupNeverLoggedIn: 1, classify.GroupInactive: 3}
		if rep.Scanned != 8 || !maps.Equal(rep.Groups, wantGroups) || rep.Online != 1 || rep.Requested != 4 {
			t.Fatalf("report %+v, want 8 scanned, groups %v, 1 online, 4 requested", rep, wantGroups)
		}
		// The grants come in batches, and so do the steps: 7 entries in all.
		var got map[uint64][]*pb.RecycleStep
		entries := func(recs []*kgo.Record) int {
			var n int
			var err error
			if got, n, err = recycling.StepsByUin(recs); err != nil {
				t.Fatal(err)
			}
			return n
		}
		stepRecs := streamstest.ReadUntil(t, b.Kafka, ns+schemas.TopicRecycleSteps, true,
			func(recs []*kgo.Record) bool { return entries(recs) >= 7 }, 30*time.Second, 2*time.Second)
		if entries(stepRecs) == len(stepRecs) {
			t.Errorf("%d steps in as many records: the grants were not batched", len(stepRecs))
		}
		granted := []pb.RecycleStepKind{pb.RecycleStepKind_TICKET_GRANTED, pb.RecycleStepKind_BAN}
		for uin, cat := range map[uint64]string{7001: recycling.Abandoned, 7002: recycling.Spam, 7003: recycling.Inactive} {
			var kinds []pb.RecycleStepKind
			for _, s := range got[uin] {
				kinds = append(kinds, s.Step)
			}
			if !slices.Equal(kinds, granted) || got[uin][0].Category != cat {
				t.Errorf("uin %d: %v, want %v as %s", uin, got[uin], granted, cat)
			}
			// The grant names the registration it judged: a later run over
			// the same rows is refused once the uin was deleted.
			if want := map[uint64]int64{7001: ago(200), 7002: ago(200), 7003: ago(400)}[uin]; len(got[uin]) > 0 && got[uin][0].RegisteredAtMs != want {
				t.Errorf("uin %d granted for the registration at %d, want %d", uin, got[uin][0].RegisteredAtMs, want)
			}
		}
		if s7 := got[7007]; len(s7) != 1 || s7[0].Step != pb.RecycleStepKind_STOPPED || !strings.Contains(s7[0].Reason, "refused: logged in") {
			t.Errorf("uin 7007 (logged in after the snapshot): %v", s7)
		}
		for _, uin := range []uint64{7004, 7005, 7006, 7008, 7009} {
			if len(got[uin]) != 0 {
				t.Errorf("active or young uin %d got steps %v", uin, got[uin])
			}
		}
	}, streamstest.InTurn)
}
