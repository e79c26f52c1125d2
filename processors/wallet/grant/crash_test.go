package grant_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	walletapp "surge/processors/wallet/app"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func crashTree() *config.Tree {
	now := time.Now()
	return &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-time.Hour), End: now.Add(time.Hour), Budget: 1 << 40}},
		Scenes: []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000},
			{ID: "coupon", Award: "coupon", MaxAmount: 1, Template: "t1", Stock: 100, Switches: config.Switches{StockControl: true}}}}}}
}

// The two grants of the crashed batch: a cash grant (its token is its
// claim) and a coupon (claimed by key).
func crashGrants() []*pb.RewardGrant {
	c := order.Number{ActID: "alice", SceneID: "rain", RainID: "r1", AwardType: pb.AwardType_CASH, Stage: 1}
	k := order.Number{ActID: "alice", SceneID: "coupon", RainID: "r1", AwardType: pb.AwardType_COUPON, Stage: 1}
	return []*pb.RewardGrant{
		{OrderNo: c.String(), ActId: "alice", ActivityId: "spring", SceneId: "rain", RainId: "r1", AwardType: pb.AwardType_CASH, Stage: 1, Amount: 250, AppId: "app"},
		{OrderNo: k.String(), ActId: "alice", ActivityId: "spring", SceneId: "coupon", RainId: "r1", AwardType: pb.AwardType_COUPON, Stage: 1, Amount: 1, AppId: "app"},
	}
}

func crashIntake(t *testing.T, kc streams.Cluster, rdb *redis.Client, ns, seed string, now func() time.Time) *grant.Intake {
	keys, err := token.FromSeed("k1", seed)
	if err != nil {
		t.Fatal(err)
	}
	cl := streamstest.Client(t, kc, kgo.ProducerLinger(time.Millisecond))
	return grant.New(grant.Config{Env: streams.Env{Namespace: ns, Log: quiet, Now: now}, Source: config.Static(crashTree()),
		Keys: keys, Redis: rdb, Producer: cl})
}

// TestGrantCrashChild is the intake process that dies between its claims
// and its produce.
func TestGrantCrashChild(t *testing.T) {
	ns := os.Getenv("SURGE_GRANT_CHILD_NS")
	if ns == "" {
		t.Skip("run by TestCrashBetweenClaimAndProduce")
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("SURGE_GRANT_CHILD_REDIS")})
	in := crashIntake(t, streams.Seeds(strings.Split(os.Getenv("SURGE_GRANT_CHILD_BROKERS"), ",")...), rdb, ns, os.Getenv("SURGE_GRANT_CHILD_SEED"), nil)
	grant.SetAfterClaims(func() { os.Exit(3) }) // as abrupt as kill -9: nothing after it runs
	in.GrantBatch(context.Background(), crashGrants())
	t.Fatal("the batch went past its crash point")
}

// An intake process dies after it claimed a cash grant's and a coupon's
// order numbers in Redis and before it produced them: the claims exist
// and nothing is on the topics. The caller retries. A retry within 2 s
// is answered as a duplicate and publishes nothing (the first attempt may
// still be on its way); a retry after that publishes each grant again,
// without taking budget or stock again. The ledger books the cash grant
// once, the coupon is on wallet.grants once, and later retries add
// nothing.
func TestCrashBetweenClaimAndProduce(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ctx := context.Background()
		ns := streamstest.Unique("gc") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, walletapp.TopicNames(ns)...)
		var raw [32]byte
		_, _ = rand.Read(raw[:])
		seed := base64.StdEncoding.EncodeToString(raw[:])

		child := exec.Command(os.Args[0], "-test.run=^TestGrantCrashChild$", "-test.count=1")
		child.Env = append(os.Environ(), "SURGE_GRANT_CHILD_NS="+ns, "SURGE_GRANT_CHILD_SEED="+seed,
			"SURGE_GRANT_CHILD_REDIS="+rdb.Options().Addr, "SURGE_GRANT_CHILD_BROKERS="+strings.Join(b.Kafka.Seeds, ","))
		var exit *exec.ExitError
		if out, err := child.CombinedOutput(); !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("child: %v, want exit 3 at the crash point\n%s", err, out)
		}

		gs := crashGrants()
		cashNo, couponNo := gs[0].OrderNo, gs[1].OrderNo
		// count checks that topic holds want committed records of orderNo.
		// A read returns once it has want records of any order, so one
		// short of want is read again (on a loaded machine the fetch of a
		// partition can miss the settle time); one over want fails at once.
		count := func(topic, orderNo string, want int) {
			t.Helper()
			for deadline := time.Now().Add(20 * time.Second); ; {
				n := countOrder(t, b, ns+topic, orderNo, want)
				if n == want {
					return
				}
				if n > want || time.Now().After(deadline) {
					t.Fatalf("%s: %d records of %s, want %d", topic, n, orderNo, want)
				}
			}
		}
		count(schemas.TopicTokens, cashNo, 0)
		count(schemas.TopicGrants, couponNo, 0)

		var now time.Time
		later := func() time.Time { return now }
		in := crashIntake(t, b.Kafka, rdb, ns, seed, later)
		tok, err := in.Tokens().Get(ctx, "alice", cashNo)
		if err != nil || tok == nil {
			t.Fatalf("the crashed attempt's token is not in Redis: %v %v", tok, err)
		}
		claimed := time.UnixMilli(tok.OpenTime) // the crashed batch's clock: its claims' time
		retry := func(what string) {
			t.Helper()
			for i, out := range in.GrantBatch(ctx, crashGrants()) {
				if out.Err != nil || !out.Result.Duplicate {
					t.Fatalf("%s, grant %d: %+v %v, want a duplicate", what, i, out.Result, out.Err)
				}
			}
		}
		now = claimed.Add(500 * time.Millisecond)
		retry("retry at once")
		count(schemas.TopicTokens, cashNo, 0)
		count(schemas.TopicGrants, couponNo, 0)

		now = claimed.Add(3 * time.Second)
		retry("retry 3 s later")
		count(schemas.TopicTokens, cashNo, 1)
		count(schemas.TopicGrants, couponNo, 1)
		if v, err := in.StockOf(ctx, "t1"); err != nil || v.Remaining != 94 {
			t.Fatalf("stock after the retries: %+v %v, want 94 of 95 sellable (taken once)", v, err)
		}

		keys, _ := token.FromSeed("k1", seed)
		led := ledger.New(ledger.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: ns, Log: quiet},
			Dir: t.TempDir(), Source: config.Static(crashTree()), Keys: keys, Tokens: in.Tokens()})
		lctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- led.Run(lctx, streams.InstanceID("l1")) }()
		defer func() { stop(); <-done }()
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			v, err := led.Balance(ctx, "alice")
			if err == nil && v.Balance == 250 && v.Unbooked == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("alice: %+v %v, want 250 booked", v, err)
			}
		}
		retry("retry once booked") // the cash token is SUCCESS; the coupon's claim was renewed
		now = now.Add(time.Second)
		retry("retry a second later")
		count(schemas.TopicLedger, cashNo, 1)
		count(schemas.TopicTokens, cashNo, 1)
		count(schemas.TopicGrants, couponNo, 1)
		if v, err := led.Balance(ctx, "alice"); err != nil || v.Balance != 250 {
			t.Fatalf("alice after every retry: %+v %v, want 250", v, err)
		}
	})
}

// countOrder reads topic (committed records, up to want of them and a
// moment more) and counts the records of orderNo: tokens, grants or
// ledger entries.
func countOrder(t *testing.T, b streamstest.Backend, topic, orderNo string, want int) int {
	t.Helper()
	n := 0
	for _, r := range streamstest.ReadN(t, b.Kafka, topic, true, want, 3*time.Second, 300*time.Millisecond) {
		var no string
		switch {
		case strings.HasSuffix(topic, schemas.TopicTokens):
			var tok pb.Token
			_ = streams.Decode(r, &tok)
			no = tok.OutTradeNo
		case strings.HasSuffix(topic, schemas.TopicGrants):
			var g pb.RewardGrant
			_ = streams.Decode(r, &g)
			no = g.OrderNo
		case strings.HasSuffix(topic, schemas.TopicLedger):
			var e pb.LedgerEntry
			_ = streams.Decode(r, &e)
			no = e.OrderNo
		}
		if no == orderNo {
			n++
		}
	}
	return n
}
