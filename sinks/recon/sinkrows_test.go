package recon_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	walletapp "surge/processors/wallet/app"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/sinks/clickhouse"
	"surge/sinks/recon"
	"surge/streams"
	"surge/streams/streamstest"
)

// Reconciliation over rows the sinks wrote from the wallet's real topics,
// not over hand-written INSERTs: grants go through the intake, the ledger
// books them, and sink-cash-grants, sink-tokens and sink-ledger write
// wallet.tokens and wallet.ledger into ClickHouse. One phase is clean;
// the other also gets a token the ledger refuses (signed with a key it
// does not trust), which is on the topic and never booked. The hour's
// run reconciles the clean phase and finds exactly that token in the
// other: granted minus booked is its amount, one lost, one unbooked.
func TestReconcilesRowsTheSinksWrote(t *testing.T) {
	// In turn: the backends share one ClickHouse table set.
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ctx := context.Background()
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		ns := streamstest.Unique("rs") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, walletapp.TopicNames(ns)...)

		// An hour of its own, in the past, so no other test's facts are in it.
		hour := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
		now := hour.Add(20 * time.Minute)
		clean, faulty := strings.TrimSuffix(ns, ".")+"-clean", strings.TrimSuffix(ns, ".")+"-faulty"
		tree := &config.Tree{GrantLag: time.Hour}
		for _, id := range []string{clean, faulty} {
			tree.Activities = append(tree.Activities, config.Activity{ID: id + "-act",
				Children: []config.Child{{ID: id, Phase: config.PhaseOfficial, Start: hour, End: hour.Add(time.Hour), Budget: 1 << 40}},
				Scenes:   []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000}}})
		}
		src := config.Static(tree)
		keys, err := token.Generate("k1")
		if err != nil {
			t.Fatal(err)
		}
		cl := streamstest.Client(t, b.Kafka, kgo.ProducerLinger(time.Millisecond))
		in := grant.New(grant.Config{Env: streams.Env{Namespace: ns, Log: quiet, Now: func() time.Time { return now }},
			Source: src, Keys: keys, Redis: rdb, Producer: cl})
		led := ledger.New(ledger.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: ns, Log: quiet},
			Dir: t.TempDir(), Source: src, Keys: keys, Tokens: in.Tokens()})
		lctx, stopLedger := context.WithCancel(ctx)
		ledDone := make(chan error, 1)
		go func() { ledDone <- led.Run(lctx, streams.InstanceID("l")) }()
		defer func() { stopLedger(); <-ledDone }()

		cashGrant := func(act, user, rain string, amount int64) *pb.RewardGrant {
			n := order.Number{ActID: user, SceneID: "rain", RainID: rain, AwardType: pb.AwardType_CASH, Stage: 1}
			return &pb.RewardGrant{OrderNo: n.String(), ActId: user, ActivityId: act, SceneId: "rain", RainId: rain,
				AwardType: pb.AwardType_CASH, Stage: 1, Amount: amount, AppId: "app"}
		}
		var gs []*pb.RewardGrant
		var want = map[string]int64{}
		for i := range 40 {
			phase := []string{clean, faulty}[i%2]
			g := cashGrant(phase+"-act", fmt.Sprintf("%su%d", strings.ReplaceAll(strings.TrimSuffix(ns, "."), "-", ""), i%7), fmt.Sprintf("r%d", i), int64(10+i))
			gs = append(gs, g)
			want[phase] += g.Amount
		}
		for i, out := range in.GrantBatch(ctx, gs) {
			if out.Err != nil {
				t.Fatalf("grant %d: %v", i, out.Err)
			}
		}
		// The fault: a token signed with a key the ledger does not trust.
		forger, _ := token.Generate("k1")
		fg := cashGrant(faulty+"-act", strings.ReplaceAll(strings.TrimSuffix(ns, "."), "-", "")+"mallory", "forged", 777)
		fg.ActivityId, fg.ParentActivityId, fg.AtMs = faulty, faulty+"-act", now.UnixMilli()
		tok := &pb.Token{AppId: "app", ActId: fg.ActId, ActivityId: faulty, SceneId: "rain", Amount: fg.Amount,
			OutTradeNo: fg.OrderNo, OpenTime: now.UnixMilli(), RainId: fg.RainId, Status: pb.TokenStatus_PROCESSING}
		forger.Sign(tok)
		v, _ := token.MarshalWithGrant(tok, fg)
		streamstest.ProduceSync(t, cl, streams.NewEncodedRecord(ns+schemas.TopicTokens, []byte(fg.ActId), tok, v))

		sctx, stopSinks := context.WithCancel(ctx)
		sinksDone := make(chan struct{})
		var running int
		for _, sk := range []*clickhouse.Sink{clickhouse.CashGrants(), clickhouse.Tokens(), clickhouse.Ledger()} {
			sk.Topic = ns + sk.Topic
			sk.Bind(store)
			running++
			go func() {
				defer func() { sinksDone <- struct{}{} }()
				_ = sk.Run(sctx, b.Kafka, streams.Group(ns+sk.Name), streams.Logger(quiet),
					streams.DeadLetterTopic(ns+schemas.TopicDeadLetter))
			}()
		}
		defer func() {
			stopSinks()
			for range running {
				<-sinksDone
			}
		}()
		rows := func(sql string) string {
			r, err := store.QueryStrings(ctx, sql)
			if err != nil || len(r) == 0 {
				return fmt.Sprint(err)
			}
			return r[0][0]
		}
		in2 := fmt.Sprintf("('%s', '%s')", clean, faulty)
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			g := rows("SELECT count() FROM grants WHERE activity_id IN " + in2)
			tk := rows("SELECT count() FROM tokens WHERE activity_id IN " + in2)
			l := rows("SELECT count() FROM ledger WHERE activity_id IN " + in2)
			if g == "41" && tk == "41" && l == "40" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sink rows: grants %s, tokens %s, ledger %s; want 41, 41, 40", g, tk, l)
			}
		}

		r := recon.New(recon.Config{Env: streams.Env{Log: quiet}, Store: store})
		res, _, err := r.Run(ctx, recon.Hour(hour, recon.AttemptH1))
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]*pb.ReconResult{}
		for _, x := range res {
			for _, phase := range []string{clean, faulty} {
				if strings.HasPrefix(x.Scope, "activity="+phase+" ") {
					found[phase+"/"+x.Check] = x
				}
			}
		}
		gc, tc := found[clean+"/"+recon.GrantedVsBooked], found[clean+"/"+recon.TokensVsLedger]
		if gc == nil || tc == nil || gc.Mismatch || tc.Mismatch || gc.Expected != want[clean] || gc.Actual != want[clean] {
			t.Fatalf("clean phase: %v / %v, want both reconciled at %d", gc, tc, want[clean])
		}
		gf, tf := found[faulty+"/"+recon.GrantedVsBooked], found[faulty+"/"+recon.TokensVsLedger]
		if gf == nil || !gf.Mismatch || gf.Expected != want[faulty]+777 || gf.Actual != want[faulty] || !strings.Contains(gf.Scope, "lost=1 ") {
			t.Fatalf("faulty phase, granted vs booked: %v; want %d granted, %d booked, 1 lost", gf, want[faulty]+777, want[faulty])
		}
		if tf == nil || !tf.Mismatch || !strings.Contains(tf.Scope, "unbooked=1") {
			t.Fatalf("faulty phase, tokens vs ledger: %v; want 1 unbooked", tf)
		}
	}, streamstest.InTurn)
}
