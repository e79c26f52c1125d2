package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	walletapp "surge/processors/wallet/app"
	"surge/processors/wallet/internal/tokencache"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/internal/guard"
	"surge/processors/wallet/ledger"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func tree(bookingsPerSecond int) *config.Tree {
	now := time.Now()
	t := &config.Tree{Activities: []config.Activity{{ID: "spring",
		Children: []config.Child{
			{ID: "spring-test", Phase: config.PhaseTest, Start: now.Add(-72 * time.Hour), End: now.Add(-48 * time.Hour), Budget: 1000},
			{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-48 * time.Hour), End: now.Add(48 * time.Hour), Budget: 1 << 40},
		},
		Scenes: []config.Scene{
			{ID: "rain", Award: "cash", MaxAmount: 1000},
			{ID: "coupon", Award: "coupon", MaxAmount: 1, Template: "t1", Stock: 100, Switches: config.Switches{StockControl: true}},
			{ID: "badge", Award: "pendant", MaxAmount: 1},
		}}}}
	t.RateLimits.BookingsPerSecond = bookingsPerSecond
	t.GrantLag = 30 * 24 * time.Hour // the tests grant into a phase that closed 48 h ago
	return t
}

func cash(act, rain string, amount int64) *pb.RewardGrant {
	n := order.Number{ActID: act, SceneID: "rain", RainID: rain, AwardType: pb.AwardType_CASH, Stage: 1}
	return &pb.RewardGrant{OrderNo: n.String(), ActId: act, ActivityId: "spring", SceneId: "rain", RainId: rain,
		AwardType: pb.AwardType_CASH, Stage: 1, Amount: amount, AppId: "app"}
}

type wallet struct {
	ns     string
	b      streamstest.Backend
	rdb    *redis.Client
	src    *config.Source
	keys   *token.Keyring
	intake *grant.Intake
	led    *ledger.Ledger
	cl     *kgo.Client
	reg    *metrics.Registry // the ledgers' metrics
	stop   context.CancelFunc
	done   chan error
}

func topics(t testing.TB, b streamstest.Backend, ns string) {
	streamstest.CreateTopics(t, b.Kafka, 6, walletapp.TopicNames(ns)...)
}

func newWallet(t *testing.T, b streamstest.Backend, rdb *redis.Client, tr *config.Tree, runLedger bool) *wallet {
	ns := streamstest.Unique("w") + "."
	topics(t, b, ns)
	keys, err := token.Generate("k1")
	if err != nil {
		t.Fatal(err)
	}
	w := &wallet{ns: ns, b: b, rdb: rdb, src: config.Static(tr), keys: keys, cl: streamstest.Client(t, b.Kafka, kgo.ProducerLinger(time.Millisecond)),
		reg: metrics.NewRegistry()}
	w.intake = grant.New(grant.Config{Env: streams.Env{Namespace: ns, Log: quiet}, Source: w.src, Keys: keys, Redis: rdb, Producer: w.cl})
	if runLedger {
		w.startLedger(t)
	}
	return w
}

func (w *wallet) startLedger(t *testing.T) {
	led := ledger.New(ledger.Config{Env: streams.Env{Kafka: w.b.Kafka, Namespace: w.ns, Log: quiet, Metrics: w.reg},
		Dir: t.TempDir() + "/ledger", Source: w.src, Keys: w.keys, Tokens: w.intake.Tokens()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w.led, w.stop, w.done = led, cancel, done
	go func() { done <- led.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ledger: %v", err)
		}
	})
	waitServing(t, led, 6)
}

// publishedGrants reads the grants intake published, waiting for up to n:
// each cash grant inside its token on wallet.tokens (one record, not two),
// any other grant on wallet.grants.
func publishedGrants(t *testing.T, b streamstest.Backend, ns string, want int) []*pb.RewardGrant {
	t.Helper()
	// Both topics through one reader, until want grants arrived (30 s at
	// most: a loaded machine is slow to the first fetch), then a second
	// more, so that extra (duplicate) records are seen too.
	recs := streamstest.ReadTopicsUntil(t, b.Kafka, []string{ns + schemas.TopicGrants, ns + schemas.TopicTokens}, true,
		func(recs []*kgo.Record) bool { return len(recs) >= want }, 30*time.Second, time.Second)
	out := make([]*pb.RewardGrant, len(recs))
	for i, r := range recs {
		out[i] = publishedGrant(t, r)
	}
	return out
}

// publishedGrant is the grant a record of wallet.grants or wallet.tokens
// carries: a cash grant rides in its token, other grants alone.
func publishedGrant(t *testing.T, r *kgo.Record) *pb.RewardGrant {
	t.Helper()
	if strings.HasSuffix(r.Topic, schemas.TopicGrants) {
		var g pb.RewardGrant
		if err := streams.Decode(r, &g); err != nil {
			t.Fatal(err)
		}
		if g.AwardType == pb.AwardType_CASH {
			t.Fatalf("cash grant %s published on wallet.grants: it rides in its token", g.OrderNo)
		}
		return &g
	}
	var tok pb.Token
	if err := streams.Decode(r, &tok); err != nil {
		t.Fatal(err)
	}
	g := tok.Grant
	if g == nil || g.OrderNo != tok.OutTradeNo || g.ActId != tok.ActId || g.Amount != tok.Amount || g.ActivityId != tok.ActivityId {
		t.Fatalf("token %s published with grant %v: each token carries its own grant", tok.OutTradeNo, g)
	}
	return g
}

// waitServing waits until l answers reads of n partitions (its own, each
// rebuilt).
func waitServing(t *testing.T, l *ledger.Ledger, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for l.Serving() < n {
		if time.Now().After(deadline) {
			t.Fatalf("ledger serves %d of %d partitions", l.Serving(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ledgerEntries reads wallet.ledger: booked orders and their sum; a
// booking twice fails the test.
func (w *wallet) ledgerEntries(t *testing.T) (map[string]int64, int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, sum := map[string]int64{}, int64(0)
	err := streams.ReadToEnd(ctx, w.b.Kafka, w.ns+schemas.TopicLedger, func(r *kgo.Record) error {
		var e pb.LedgerEntry
		if err := streams.Decode(r, &e); err != nil {
			return err
		}
		if _, dup := out[e.OrderNo]; dup {
			t.Fatalf("order %s booked twice", e.OrderNo)
		}
		// Reconciliation counts a booking in its grant's minute.
		if e.Kind == pb.LedgerKind_GRANT && (e.GrantedAtMs <= 0 || e.GrantedAtMs > e.BookedAtMs) {
			t.Fatalf("order %s: granted_at_ms %d, booked at %d", e.OrderNo, e.GrantedAtMs, e.BookedAtMs)
		}
		out[e.OrderNo] = e.Amount
		sum += e.Amount
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out, sum
}

func waitBooked(t *testing.T, w *wallet, n int) (map[string]int64, int64) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, sum := w.ledgerEntries(t)
		if len(m) >= n {
			return m, sum
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d booked", len(m), n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Grants are accepted at once; the user's balance includes the tokens not
// yet booked; after the backlog drains, booked equals granted.
func TestBacklogInvisibleAndBookedEqualsGranted(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		// Booking capacity 40/s: the 400 grants take 10 s to book, far
		// longer than granting them takes even on a loaded machine (at
		// 200/s a slow run booked them all before the check: CI, once).
		w := newWallet(t, b, rdb, tree(40), true)
		ctx := context.Background()
		var granted int64
		per := map[string]int64{}
		u3Orders := map[string]int64{}
		for i := range 400 {
			act := fmt.Sprintf("u%d", i%20)
			g := cash(act, fmt.Sprintf("r%d", i), int64(1+i%100))
			res, err := w.intake.Grant(ctx, g)
			if err != nil || res.Token == nil || res.Duplicate || res.Activity != "spring-live" {
				t.Fatalf("grant %d: %+v %v", i, res, err)
			}
			granted += g.Amount
			per[act] += g.Amount
			if act == "u3" {
				u3Orders[g.OrderNo] = g.Amount
			}
		}
		// Right after granting most is unbooked, yet every balance is whole.
		v, err := w.led.Balance(ctx, "u3")
		if err != nil {
			t.Fatal(err)
		}
		if v.Balance != per["u3"] || v.Income != per["u3"] {
			t.Fatalf("u3 sees %d, granted %d (unbooked %d)", v.Balance, per["u3"], v.Unbooked)
		}
		backlog := 0
		for act := range per {
			vv, err := w.led.Balance(ctx, act)
			if err != nil {
				t.Fatal(err)
			}
			backlog += vv.Unbooked
		}
		if backlog == 0 {
			t.Fatal("no backlog: the test needs booking behind granting")
		}
		items, _, err := w.led.Flow(ctx, "u3", 0, 5)
		if err != nil || len(items) != 5 {
			t.Fatalf("flow page: %d items, %v", len(items), err)
		}
		for i := 1; i < len(items); i++ {
			if items[i].AtMs > items[i-1].AtMs {
				t.Fatal("flow not newest first")
			}
		}
		_, sum := waitBooked(t, w, 400)
		if sum != granted {
			t.Fatalf("booked %d, granted %d", sum, granted)
		}
		// Every booking asked whether its order was booked; all were new,
		// and the key filter answered without a store lookup.
		lookups := w.reg.NewCounterVec("surge_wallet_ledger_order_lookups_total", "", "answer")
		if n := lookups.With("filter_absent").Value(); n < 400 {
			t.Fatalf("%v of 400 new orders answered by the key filter", n)
		}
		// The store is asked only about keys the filter holds: false
		// positives, the reads of u3's 20 tokens above, which may meet keys
		// of the open batch (in the filter, not yet in the store), and the
		// orders of a batch aborted and booked again (in the filter from
		// the first attempt: a busy CI machine aborted enough to reach 77).
		// A filter that does not filter sends all 400 there.
		if n := lookups.With("store_absent").Value(); n >= 200 {
			t.Fatalf("%v lookups of absent orders reached the store: the filter is not filtering", n)
		}
		for act, want := range per {
			if v, _ := w.led.Balance(ctx, act); v.Balance != want || v.Unbooked != 0 {
				t.Fatalf("%s: balance %d (unbooked %d), want %d", act, v.Balance, v.Unbooked, want)
			}
		}
		// Booked, u3's flow list is each of its grants once, from the store.
		items, _, err = w.led.Flow(ctx, "u3", 0, 1000)
		if err != nil || len(items) != len(u3Orders) {
			t.Fatalf("u3's flow: %d items, %v; granted %d", len(items), err, len(u3Orders))
		}
		for _, it := range items {
			if amount, ok := u3Orders[it.OrderNo]; !ok || !it.Booked || it.Amount != amount || it.Kind != pb.LedgerKind_GRANT || it.AtMs == 0 {
				t.Fatalf("u3's flow item %+v; granted %d", it, amount)
			}
			delete(u3Orders, it.OrderNo)
		}
		// Pages past the end, and pages whose first index overflows, are
		// empty, never a panic.
		for _, page := range []int{len(items), 1 << 40, math.MaxInt / 3, math.MaxInt} {
			if got, _, err := w.led.Flow(ctx, "u3", page, 1000); err != nil || len(got) != 0 {
				t.Fatalf("u3's flow page %d: %d items, %v", page, len(got), err)
			}
		}
	})
}

// TestBalanceNeverDipsWhileBooking reads a user's balance while grants to
// the user are booked: every read includes every grant accepted before it
// began, booked or not. A read that met a commit half-way (the balance
// from before it, the "booked?" answers from after it) used to drop the
// batch's tokens from the view.
func TestBalanceNeverDipsWhileBooking(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), true)
		ctx := context.Background()
		var granted atomic.Int64
		stop := make(chan struct{})
		var dips atomic.Int64
		var reads atomic.Int64
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					before := granted.Load()
					v, err := w.led.Balance(ctx, "hot")
					if err != nil {
						t.Error(err)
						return
					}
					reads.Add(1)
					if v.Balance < before {
						dips.Add(1)
						t.Errorf("balance %d after %d was granted (%d unbooked)", v.Balance, before, v.Unbooked)
					}
				}
			}()
		}
		for i := range 400 {
			g := cash("hot", fmt.Sprintf("r%d", i), int64(1+i%7))
			if _, err := w.intake.Grant(ctx, g); err != nil {
				t.Fatal(err)
			}
			granted.Add(g.Amount)
		}
		waitBooked(t, w, 400)
		close(stop)
		wg.Wait()
		if reads.Load() < 100 {
			t.Fatalf("only %d reads while booking; the test proves nothing", reads.Load())
		}
		t.Logf("%d reads, %d dips", reads.Load(), dips.Load())
	})
}

// Bad grants are refused with a clear error and nothing is published.
func TestIntakeRefusals(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		old := cash("u1", "r0", 5)
		old.AtMs = time.Now().Add(-80 * time.Hour).UnixMilli() // before the first phase, within the lag
		longAgo := cash("u1", "r7", 5)
		longAgo.AtMs = time.Now().Add(-31 * 24 * time.Hour).UnixMilli()
		ahead := cash("u1", "r8", 5)
		ahead.AtMs = time.Now().Add(2 * time.Minute).UnixMilli()
		wrongType := cash("u1", "r1", 1)
		wrongType.SceneId, wrongType.OrderNo = "coupon", order.Number{ActID: "u1", SceneID: "coupon", RainID: "r1", AwardType: pb.AwardType_CASH, Stage: 1}.String()
		cases := map[string]struct {
			g    *pb.RewardGrant
			want error
			text string
		}{
			"malformed order":      {&pb.RewardGrant{OrderNo: "nope", ActId: "u1", ActivityId: "spring", SceneId: "rain", AwardType: pb.AwardType_CASH, Amount: 1}, grant.ErrInvalid, "want actID_sceneID"},
			"mismatched":           {func() *pb.RewardGrant { g := cash("u1", "r2", 1); g.Stage = 9; return g }(), grant.ErrInvalid, "does not match"},
			"negative":             {cash("u1", "r3", -5), grant.ErrInvalid, "must be positive"},
			"oversized":            {cash("u1", "r4", 1001), grant.ErrOverCap, "1001 > 1000"},
			"unknown scene":        {func() *pb.RewardGrant { g := cash("u1", "r5", 1); g.SceneId = "x"; g.OrderNo = "u1_x_r5_1_1"; return g }(), grant.ErrInvalid, "unknown scene"},
			"unknown act":          {func() *pb.RewardGrant { g := cash("u1", "r6", 1); g.ActivityId = "autumn"; return g }(), grant.ErrInvalid, "unknown activity"},
			"outside phases":       {old, grant.ErrInvalid, "outside every phase window"},
			"earned too long ago":  {longAgo, grant.ErrInvalid, "before the server's time"},
			"earned in the future": {ahead, grant.ErrInvalid, "after the server's time"},
			"wrong award":          {wrongType, grant.ErrInvalid, "grants coupon"},
			"not UTF-8":            {func() *pb.RewardGrant { g := cash("u1", "r9", 1); g.AppId = "app\xff"; return g }(), grant.ErrInvalid, "app_id is not valid UTF-8"},
		}
		for name, c := range cases {
			_, err := w.intake.Grant(ctx, c.g)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
				t.Errorf("%s: %v", name, err)
			}
		}
		// The test phase has a budget of 1000 cents: the cap holds.
		tp := cash("u2", "budget", 600)
		tp.AtMs = time.Now().Add(-60 * time.Hour).UnixMilli()
		if res, err := w.intake.Grant(ctx, tp); err != nil || res.Activity != "spring-test" {
			t.Fatalf("test phase grant: %v", err)
		}
		tp2 := cash("u2", "budget2", 600)
		tp2.AtMs = tp.AtMs
		if _, err := w.intake.Grant(ctx, tp2); !errors.Is(err, grant.ErrOverBudget) {
			t.Fatalf("over budget: %v", err)
		}
		// The same order number again: the original token, nothing new.
		res, err := w.intake.Grant(ctx, tp)
		if err != nil || !res.Duplicate || res.Token == nil {
			t.Fatalf("duplicate: %+v %v", res, err)
		}
		if gs := publishedGrants(t, b, w.ns, 1); len(gs) != 1 {
			t.Fatalf("%d grants published; only the one accepted may be", len(gs))
		}
	})
}

// TestConcurrentDuplicatesClaimOnce sends every order number ten times at
// once, through batches as `surge wallet` serves them and also twice
// within one batch: each order number is accepted once, every duplicate
// gets the accepted token back, the budget is spent once per order, and
// one grant and one token per order are published. Coupons and pendants
// (claimed by key) go through the same batches.
func TestConcurrentDuplicatesClaimOnce(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		const orders, copies = 60, 10
		var want []*pb.RewardGrant
		var cashSum int64
		for i := range orders {
			g := cash(fmt.Sprintf("u%d", i%7), fmt.Sprintf("r%d", i), int64(1+i))
			if i%10 == 9 { // a pendant now and then: claimed by key
				g.SceneId, g.AwardType, g.Amount = "badge", pb.AwardType_PENDANT, 1
				g.OrderNo = order.Number{ActID: g.ActId, SceneID: "badge", RainID: g.RainId, AwardType: pb.AwardType_PENDANT, Stage: 1}.String()
			} else {
				cashSum += g.Amount
			}
			want = append(want, g)
		}
		// One batch holding every order number twice.
		var twice []*pb.RewardGrant
		for _, g := range want[:10] {
			twice = append(twice, proto.Clone(g).(*pb.RewardGrant), proto.Clone(g).(*pb.RewardGrant))
		}
		first := w.intake.GrantBatch(ctx, twice)
		batcher := grant.NewBatcher(w.intake, 32, time.Millisecond, 4)
		defer batcher.Close()
		type answer struct {
			res *grant.Result
			err error
		}
		answers := make([][]answer, orders)
		for i := range answers {
			answers[i] = make([]answer, copies)
		}
		// Half the copies one call per grant, half one GrantBatch call per
		// copy (what an HTTP batch does): duplicates across both are found.
		var wg sync.WaitGroup
		for c := range copies {
			if c%2 == 1 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					gs := make([]*pb.RewardGrant, orders)
					for i := range orders {
						gs[i] = proto.Clone(want[(i+c*7)%orders]).(*pb.RewardGrant)
					}
					for i, o := range batcher.GrantBatch(ctx, gs) {
						answers[(i+c*7)%orders][c] = answer{o.Result, o.Err}
					}
				}()
				continue
			}
			for i := range orders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := batcher.Grant(ctx, proto.Clone(want[(i+c*7)%orders]).(*pb.RewardGrant))
					answers[(i+c*7)%orders][c] = answer{res, err}
				}()
			}
		}
		wg.Wait()
		// A closed batcher answers at once, every grant refused.
		closed := grant.NewBatcher(w.intake, 32, time.Millisecond, 1)
		closed.Close()
		for _, o := range closed.GrantBatch(ctx, []*pb.RewardGrant{cash("u1", "late", 1), cash("u2", "late", 1)}) {
			if !errors.Is(o.Err, grant.ErrClosed) {
				t.Fatalf("grant through a closed batcher: %+v %v", o.Result, o.Err)
			}
		}
		if res, err := closed.Grant(ctx, cash("u3", "late", 1)); !errors.Is(err, grant.ErrClosed) {
			t.Fatalf("single grant through a closed batcher: %+v %v", res, err)
		}
		for i, o := range first {
			if o.Err != nil || o.Result.Duplicate != (i%2 == 1) {
				t.Fatalf("batch with each order twice, grant %d: %+v %v", i, o.Result, o.Err)
			}
		}
		for i, as := range answers {
			fresh := 0
			if i < 10 {
				fresh = 1 // accepted by the first batch
			}
			for _, a := range as {
				if a.err != nil {
					t.Fatalf("order %d: %v", i, a.err)
				}
				if !a.res.Duplicate {
					fresh++
				}
				if want[i].AwardType == pb.AwardType_CASH {
					if a.res.Token == nil || a.res.Token.OutTradeNo != want[i].OrderNo {
						t.Fatalf("order %d: answered without its token: %+v", i, a.res)
					}
					if err := w.keys.Verify(a.res.Token); err != nil {
						t.Fatalf("order %d: %v", i, err)
					}
				}
			}
			if fresh != 1 {
				t.Fatalf("order %d accepted %d times", i, fresh)
			}
		}
		// Every answer for one order carries the same token.
		for i, as := range answers {
			if want[i].AwardType != pb.AwardType_CASH {
				continue
			}
			for _, a := range as[1:] {
				if string(a.res.Token.Signature) != string(as[0].res.Token.Signature) || a.res.Token.BatchIndex != as[0].res.Token.BatchIndex {
					t.Fatalf("order %d answered with two different tokens", i)
				}
			}
		}
		spent, err := rdb.Get(ctx, w.ns+"wbudget:spring-live").Int64()
		if err != nil || spent != cashSum+orders/10 {
			t.Fatalf("budget spent %d (%v), want %d: duplicates must give theirs back", spent, err, cashSum+orders/10)
		}
		if n := len(publishedGrants(t, b, w.ns, orders)); n != orders {
			t.Fatalf("%d grants published, want %d", n, orders)
		}
		if n := len(streamstest.ReadN(t, b.Kafka, w.ns+schemas.TopicTokens, true, orders-orders/10, 30*time.Second, time.Second)); n != orders-orders/10 {
			t.Fatalf("%d tokens published, want %d", n, orders-orders/10)
		}
	})
}

// TestFailedPublishLeavesNothing: a grant whose records cannot be produced
// is refused, and nothing of it stays behind: no token in the user's
// Redis hash (it would show in the balance and be force-booked by a
// withdrawal, though never granted), no budget spent, and the order
// number free for the caller's retry.
func TestFailedPublishLeavesNothing(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		dead, err := b.Kafka.NewClient()
		if err != nil {
			t.Fatal(err)
		}
		dead.Close() // every produce fails
		broken := grant.New(grant.Config{Env: streams.Env{Namespace: w.ns, Log: quiet}, Source: w.src, Keys: w.keys, Redis: rdb, Producer: dead})
		g := cash("u9", "r1", 300)
		g.AtMs = time.Now().Add(-60 * time.Hour).UnixMilli() // the test phase: a budget of 1000
		if _, err := broken.Grant(ctx, proto.Clone(g).(*pb.RewardGrant)); err == nil {
			t.Fatal("a grant that was not published was accepted")
		}
		if toks, _, err := broken.Tokens().All(ctx, "u9"); err != nil || len(toks) != 0 {
			t.Fatalf("after a failed publish the user holds %d tokens (%v); want none", len(toks), err)
		}
		// The retry is a fresh grant, and the whole budget is still there:
		// 300 + 700 fit in 1000 only if the failed 300 was refunded.
		res, err := w.intake.Grant(ctx, proto.Clone(g).(*pb.RewardGrant))
		if err != nil || res.Duplicate || res.Token == nil {
			t.Fatalf("retry after a failed publish: %+v %v", res, err)
		}
		rest := cash("u9", "r2", 700)
		rest.AtMs = g.AtMs
		if _, err := w.intake.Grant(ctx, rest); err != nil {
			t.Fatalf("the failed grant's budget was not refunded: %v", err)
		}
		if toks, _, _ := w.intake.Tokens().All(ctx, "u9"); len(toks) != 2 {
			t.Fatalf("user holds %d tokens; want the 2 published", len(toks))
		}
	})
}

// lostReplies is a Redis client hook: every pipeline runs, then the
// client reports an error, as when the connection drops before the
// replies arrive.
type lostReplies struct{}

func (lostReplies) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (lostReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (lostReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := next(ctx, cmds); err != nil {
			return err
		}
		return errors.New("connection lost before the replies")
	}
}

// TestClaimThatLandedButFailedIsReleased: when the idempotency claim
// reached Redis but its reply was lost, the grant is refused and its claim
// released, so the caller's retry is accepted as new and published, not
// answered as a duplicate of a grant that never was. For a cash grant the
// claim is its token; for a pendant, its claim key.
func TestClaimThatLandedButFailedIsReleased(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		lossy := redis.NewClient(rdb.Options())
		lossy.AddHook(lostReplies{})
		t.Cleanup(func() { lossy.Close() })
		broken := grant.New(grant.Config{Env: streams.Env{Namespace: w.ns, Log: quiet}, Source: w.src, Keys: w.keys, Redis: lossy, Producer: w.cl})
		pendant := cash("u7", "p1", 1)
		pendant.SceneId, pendant.AwardType = "badge", pb.AwardType_PENDANT
		pendant.OrderNo = order.Number{ActID: "u7", SceneID: "badge", RainID: "p1", AwardType: pb.AwardType_PENDANT, Stage: 1}.String()
		for _, g := range []*pb.RewardGrant{cash("u7", "r1", 40), pendant} {
			if _, err := broken.Grant(ctx, proto.Clone(g).(*pb.RewardGrant)); err == nil {
				t.Fatalf("%s: accepted though its claim's reply was lost", g.OrderNo)
			}
			res, err := w.intake.Grant(ctx, proto.Clone(g).(*pb.RewardGrant))
			if err != nil || res.Duplicate {
				t.Fatalf("%s: retry after a lost reply: %+v %v; want a fresh grant", g.OrderNo, res, err)
			}
		}
		if n := len(publishedGrants(t, b, w.ns, 2)); n != 2 {
			t.Fatalf("%d grants published, want the 2 retries", n)
		}
		if spent, _ := rdb.Get(ctx, w.ns+"wbudget:spring-live").Int64(); spent != 41 {
			t.Fatalf("budget spent %d, want 41: the refused grants' budget comes back", spent)
		}
	})
}

// Tokens re-delivered ten times over, shuffled, into a ledger killed three
// times mid-way: every order is booked exactly once, the sums agree, and a
// tampered token is dead-lettered and never booked.
func TestNoDoubleBookingUnderDuplicatesAndCrashes(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		const users, grants = 50, 2000
		var toks []*pb.Token
		var granted int64
		for i := range grants {
			res, err := w.intake.Grant(ctx, cash(fmt.Sprintf("u%d", i%users), fmt.Sprintf("r%d", i), int64(1+i%500)))
			if err != nil {
				t.Fatal(err)
			}
			toks = append(toks, res.Token)
			granted += res.Token.Amount
		}
		// Ten more copies of every token, shuffled (same key, so per-user
		// order changes but no partition mixes users).
		var recs []*kgo.Record
		for range 10 {
			for _, tok := range toks {
				r, _ := streams.NewRecord(w.ns+schemas.TopicTokens, []byte(tok.ActId), tok)
				recs = append(recs, r)
			}
		}
		rng := rand.New(rand.NewPCG(1, 2))
		rng.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
		forged := &pb.Token{}
		*forged = pb.Token{AppId: "app", ActId: "u1", ActivityId: "spring-live", SceneId: "rain", Amount: 999999, OutTradeNo: "u1_rain_forged_1_1",
			KeyId: "k1", Signature: toks[1].Signature, Status: pb.TokenStatus_PROCESSING}
		fr, _ := streams.NewRecord(w.ns+schemas.TopicTokens, []byte("u1"), forged)
		// A real batch-signed token altered: its signature and proof kept,
		// its amount and order number changed.
		altered := proto.Clone(toks[1]).(*pb.Token)
		altered.Amount, altered.OutTradeNo = 999998, "u1_rain_altered_1_1"
		ar, _ := streams.NewRecord(w.ns+schemas.TopicTokens, []byte("u1"), altered)
		// And one with no status at all (never written by intake).
		nostatus := &pb.Token{AppId: "app", ActId: "u1", ActivityId: "spring-live", SceneId: "rain", Amount: 5, OutTradeNo: "u1_rain_nostatus_1_1"}
		w.keys.Sign(nostatus)
		nr, _ := streams.NewRecord(w.ns+schemas.TopicTokens, []byte("u1"), nostatus)
		recs = append(recs[:len(recs)/2], append([]*kgo.Record{fr, ar, nr}, recs[len(recs)/2:]...)...)
		streamstest.ProduceSync(t, w.cl, recs...)

		seed := token.ExportSeedForTest(w.keys)
		dir := t.TempDir()
		for kill := 1; kill <= 3; kill++ {
			c := spawnLedger(t, b, rdb, w.ns, dir, seed)
			deadline := time.Now().Add(60 * time.Second)
			for {
				m, _ := w.ledgerEntries(t)
				if len(m) > 0 && len(m) >= kill*grants/8 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no progress before kill %d", kill)
				}
				time.Sleep(50 * time.Millisecond)
			}
			c.Process.Kill()
			_ = c.Wait()
			if m, _ := w.ledgerEntries(t); len(m) == grants {
				t.Fatalf("everything booked before kill %d; the test needs a slower ledger", kill)
			}
		}
		c := spawnLedger(t, b, rdb, w.ns, dir, seed)
		defer func() { c.Process.Kill(); _ = c.Wait() }()
		m, sum := waitBooked(t, w, grants)
		if len(m) != grants || sum != granted {
			t.Fatalf("booked %d orders for %d, granted %d orders for %d", len(m), sum, grants, granted)
		}
		if _, ok := m[forged.OutTradeNo]; ok {
			t.Fatal("forged token booked")
		}
		if _, ok := m[altered.OutTradeNo]; ok {
			t.Fatal("altered batch token booked")
		}
		if _, ok := m[nostatus.OutTradeNo]; ok {
			t.Fatal("token without a status booked")
		}
		dlq := streamstest.ReadN(t, b.Kafka, w.ns+schemas.TopicDeadLetter, true, 2, 20*time.Second, time.Second)
		found, foundAltered := false, false
		for _, r := range dlq {
			why, _ := streams.Header(r, "dlq-reason")
			found = found || strings.Contains(why, "token refused: u1_rain_forged_1_1")
			foundAltered = foundAltered || strings.Contains(why, "token refused: u1_rain_altered_1_1")
		}
		if !found || !foundAltered {
			t.Fatalf("forged token dead-lettered: %v; altered batch token: %v", found, foundAltered)
		}
	})
}

// TestLedgerChild is the ledger process the crash test kills.
func TestLedgerChild(t *testing.T) {
	ns := os.Getenv("SURGE_LEDGER_CHILD_NS")
	if ns == "" {
		t.Skip("run by the crash test")
	}
	keys, err := token.FromSeed("k1", os.Getenv("SURGE_LEDGER_CHILD_SEED"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("SURGE_LEDGER_CHILD_REDIS")})
	src := config.Static(tree(300)) // slow enough to be killed mid-way
	l := ledger.New(ledger.Config{Env: streams.Env{Kafka: streams.Seeds(strings.Split(os.Getenv("SURGE_LEDGER_CHILD_BROKERS"), ",")...), Namespace: ns, Log: quiet},
		Dir: os.Getenv("SURGE_LEDGER_CHILD_DIR"), Source: src, Keys: keys, Tokens: tokencache.New(rdb, ns+"wtok:", 0)})
	_ = l.Run(context.Background(), streams.ClientOpts(kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond)))
}

func spawnLedger(t *testing.T, b streamstest.Backend, rdb *redis.Client, ns, dir, seed string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLedgerChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SURGE_LEDGER_CHILD_NS="+ns, "SURGE_LEDGER_CHILD_DIR="+dir, "SURGE_LEDGER_CHILD_SEED="+seed,
		"SURGE_LEDGER_CHILD_REDIS="+rdb.Options().Addr, "SURGE_LEDGER_CHILD_BROKERS="+strings.Join(b.Kafka.Seeds, ","))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// A withdrawal first books the user's unbooked tokens, so it is never
// blocked by the backlog; one over the balance is refused; a withdrawal id
// is booked once.
func TestWithdrawalForceBooks(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		for i := range 5 {
			if _, err := w.intake.Grant(ctx, cash("rich", fmt.Sprintf("r%d", i), 100)); err != nil {
				t.Fatal(err)
			}
		}
		// The withdrawal reaches the ledger before the tokens do: they are
		// still unbooked in its input when it arrives.
		var recs []*kgo.Record
		for _, wd := range []*pb.Withdrawal{{WithdrawId: "w1", ActId: "rich", Amount: 450}, {WithdrawId: "w2", ActId: "rich", Amount: 100},
			{WithdrawId: "w1", ActId: "rich", Amount: 450}} {
			r, _ := streams.NewRecord(w.ns+schemas.TopicWithdrawals, []byte(wd.ActId), wd)
			recs = append(recs, r)
		}
		// Produce the withdrawals first, then start the ledger: it reads the
		// withdrawal partition and the token partition; the forced booking
		// must not depend on which comes first.
		streamstest.ProduceSync(t, w.cl, recs...)
		w.startLedger(t)
		res := streamstest.ReadN(t, b.Kafka, w.ns+schemas.TopicWithdrawResult, true, 3, 30*time.Second, time.Second)
		if len(res) != 3 {
			t.Fatalf("%d answers", len(res))
		}
		var outs []*pb.Withdrawal
		for _, r := range res {
			var o pb.Withdrawal
			if err := streams.Decode(r, &o); err != nil {
				t.Fatal(err)
			}
			outs = append(outs, &o)
		}
		if outs[0].Refused || outs[0].BalanceAfter != 50 {
			t.Fatalf("first withdrawal: %+v", outs[0])
		}
		if !outs[1].Refused || !strings.Contains(outs[1].Reason, "over balance: 100 requested, 50 available") {
			t.Fatalf("second withdrawal: %+v", outs[1])
		}
		if outs[2].Refused || outs[2].Reason != "already booked" {
			t.Fatalf("repeated withdrawal: %+v", outs[2])
		}
		m, sum := waitBooked(t, w, 6)
		if len(m) != 6 || sum != 500-450 {
			t.Fatalf("ledger %v sum %d", m, sum)
		}
		if v, _ := w.led.Balance(ctx, "rich"); v.Balance != 50 {
			t.Fatalf("balance %d", v.Balance)
		}
	})
}

// With the token Redis switched off, grants still go through and reads
// show what is booked; nothing is lost.
func TestDegradedTokenRedis(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		tr := tree(0)
		tr.Degrade = map[string]bool{guard.TokenRedis: true}
		w := newWallet(t, b, rdb, tr, true)
		ctx := context.Background()
		for i := range 10 {
			if _, err := w.intake.Grant(ctx, cash("d", fmt.Sprintf("r%d", i), 10)); err != nil {
				t.Fatal(err)
			}
		}
		if toks, _, _ := w.intake.Tokens().All(ctx, "d"); len(toks) != 0 {
			t.Fatal("tokens written to a switched-off Redis")
		}
		waitBooked(t, w, 10)
		deadline := time.Now().Add(10 * time.Second)
		for {
			v, _ := w.led.Balance(ctx, "d")
			if v.Balance == 100 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("balance %d", v.Balance)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// An order accepted while token Redis was switched off (claimed by its own
// key, not in the user's token hash) is a duplicate when it is retried
// after the switch is back on: its budget is spent once. The two intakes
// are the one before and the one after the switch (or two instances).
func TestDuplicateAcrossTheTokenRedisSwitch(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		off := tree(0)
		off.Degrade = map[string]bool{guard.TokenRedis: true}
		w := newWallet(t, b, rdb, off, false)
		on := grant.New(grant.Config{Env: streams.Env{Namespace: w.ns, Log: quiet}, Source: config.Static(tree(0)), Keys: w.keys, Redis: rdb, Producer: w.cl})
		ctx := context.Background()
		g := cash("x", "r1", 10)
		if res, err := w.intake.Grant(ctx, proto.Clone(g).(*pb.RewardGrant)); err != nil || res.Duplicate {
			t.Fatalf("switched off: %+v %v", res, err)
		}
		if res, err := on.Grant(ctx, proto.Clone(g).(*pb.RewardGrant)); err != nil || !res.Duplicate {
			t.Fatalf("retried after the switch came back on: %+v %v", res, err)
		}
		if spent, _ := rdb.Get(ctx, w.ns+"wbudget:spring-live").Int64(); spent != 10 {
			t.Fatalf("budget spent %d, want 10", spent)
		}
		if res, err := on.Grant(ctx, cash("x", "r2", 5)); err != nil || res.Duplicate || res.Token == nil {
			t.Fatalf("a new order after the switch: %+v %v", res, err)
		}
	})
}

// Load-test traffic goes to shadow topics and keys that expire.
func TestShadowTraffic(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		streamstest.CreateTopics(t, b.Kafka, 6, schemas.ShadowPrefix+w.ns+schemas.TopicGrants, schemas.ShadowPrefix+w.ns+schemas.TopicTokens)
		g := cash("s1", "r1", 5)
		g.Shadow = true
		if _, err := w.intake.Grant(context.Background(), g); err != nil {
			t.Fatal(err)
		}
		if n := len(streamstest.ReadN(t, b.Kafka, schemas.ShadowPrefix+w.ns+schemas.TopicTokens, true, 1, 10*time.Second, 0)); n != 1 {
			t.Fatalf("%d shadow tokens", n)
		}
		if n := len(streamstest.ReadN(t, b.Kafka, w.ns+schemas.TopicTokens, true, 1, 2*time.Second, 0)); n != 0 {
			t.Fatal("shadow grant reached the live topic")
		}
		ttl, err := rdb.TTL(context.Background(), "shadow:"+w.ns+"wtok:s1").Result()
		if err != nil || ttl <= 0 {
			t.Fatalf("shadow token key ttl %v %v", ttl, err)
		}
		if n, _ := rdb.Exists(context.Background(), w.ns+"wtok:s1").Result(); n != 0 {
			t.Fatal("shadow token in the live key")
		}
	})
}

// The account store is a cache: a ledger started on an empty directory
// rebuilds it from wallet.ledger to exactly the same balances and flows.
func TestRebuildByReplay(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		tr := tree(0)
		tr.Degrade = map[string]bool{guard.TokenRedis: true} // compare the booked store alone
		w := newWallet(t, b, rdb, tr, true)
		ctx := context.Background()
		for i := range 300 {
			if _, err := w.intake.Grant(ctx, cash(fmt.Sprintf("u%d", i%7), fmt.Sprintf("r%d", i), int64(1+i))); err != nil {
				t.Fatal(err)
			}
		}
		waitBooked(t, w, 300)
		type view struct {
			v     ledger.View
			items []ledger.Item
		}
		snapshot := func(l *ledger.Ledger) map[string]view {
			out := map[string]view{}
			for u := range 7 {
				act := fmt.Sprintf("u%d", u)
				items, v, err := l.Flow(ctx, act, 0, 1000)
				if err != nil {
					t.Fatal(err)
				}
				out[act] = view{v, items}
			}
			return out
		}
		deadline := time.Now().Add(10 * time.Second)
		var before map[string]view
		for {
			before = snapshot(w.led)
			total := int64(0)
			for _, x := range before {
				total += x.v.Balance
			}
			if total == 300*301/2 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		// A second ledger, fresh directory, in place of the first: rebuilt
		// from the topic. (Beside it, it would own half the users.)
		w.stop()
		w.startLedger(t)
		after := snapshot(w.led)
		for act, x := range before {
			y := after[act]
			if x.v != y.v || len(x.items) != len(y.items) {
				t.Fatalf("%s: before %+v (%d items), rebuilt %+v (%d items)", act, x.v, len(x.items), y.v, len(y.items))
			}
			for i := range x.items {
				if x.items[i] != y.items[i] {
					t.Fatalf("%s item %d: %+v vs %+v", act, i, x.items[i], y.items[i])
				}
			}
		}
	})
}

// A partition that moves to another ledger instance and back is rebuilt
// from wallet.ledger on its return: instance A never books again an order
// that B booked while it owned the user, and A's balances include B's
// bookings.
func TestPartitionMovesBetweenInstances(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		w := newWallet(t, b, rdb, tree(0), false)
		ctx := context.Background()
		const users = 30
		var toks []*pb.Token
		granted := map[string]int64{}
		grantN := func(rain string, n int) []*pb.Token {
			var out []*pb.Token
			for i := range n {
				act := fmt.Sprintf("u%d", i%users)
				res, err := w.intake.Grant(ctx, cash(act, fmt.Sprintf("%s%d", rain, i), int64(1+i%50)))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, res.Token)
				granted[act] += res.Token.Amount
			}
			toks = append(toks, out...)
			return out
		}
		start := func(name string) (*ledger.Ledger, context.CancelFunc, chan error) {
			l := ledger.New(ledger.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: w.ns, Log: quiet},
				Dir: t.TempDir() + "/" + name, Source: w.src, Keys: w.keys, Tokens: w.intake.Tokens()})
			lctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- l.Run(lctx, streams.InstanceID(name), streams.Backoff(5*time.Millisecond, 50*time.Millisecond))
			}()
			return l, cancel, done
		}
		a, stopA, doneA := start("a")
		defer func() { stopA(); <-doneA }()
		grantN("one", 300)
		waitBooked(t, w, 300)

		bl, stopB, doneB := start("b")
		// Keep granting until B has taken partitions and booked some.
		deadline := time.Now().Add(60 * time.Second)
		for round := 0; bl.Bookings.Load() == 0; round++ {
			if time.Now().After(deadline) {
				t.Fatal("instance b never booked")
			}
			grantN(fmt.Sprintf("two%d-", round), 60)
			time.Sleep(200 * time.Millisecond)
		}
		waitBooked(t, w, len(toks))
		stopB()
		if err := <-doneB; err != nil {
			t.Fatal(err)
		}
		// Every token again (B's bookings among them), then fresh ones
		// behind them in every partition: once those are booked, A has
		// seen the duplicates.
		var recs []*kgo.Record
		for _, tok := range toks {
			r, _ := streams.NewRecord(w.ns+schemas.TopicTokens, []byte(tok.ActId), tok)
			recs = append(recs, r)
		}
		streamstest.ProduceSync(t, w.cl, recs...)
		grantN("three", 2*users)
		m, sum := waitBooked(t, w, len(toks)) // fails on an order booked twice
		var total int64
		for _, v := range granted {
			total += v
		}
		if len(m) != len(toks) || sum != total {
			t.Fatalf("booked %d orders for %d, granted %d for %d", len(m), sum, len(toks), total)
		}
		waitServing(t, a, 6) // every partition back on a, rebuilt
		for act, want := range granted {
			v, err := a.Balance(ctx, act)
			if err != nil {
				t.Fatal(err)
			}
			if v.Balance != want {
				t.Fatalf("%s: balance %d on instance a, granted %d (b booked %d in all)", act, v.Balance, want, bl.Bookings.Load())
			}
		}
		t.Logf("bookings staged (aborted batches included): a %d, b %d; %d orders", a.Bookings.Load(), bl.Bookings.Load(), len(toks))
	})
}
