package grant_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"surge/processors/wallet/config"
	"surge/processors/wallet/grant"
	"surge/processors/wallet/internal/stock"
	"surge/processors/wallet/order"
	"surge/processors/wallet/token"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/connect"
	"surge/streams/streamstest"
)

// Redis loses the wallet's state in the middle of a campaign whose demand
// is three times its phase budget and its coupon stock. The budget and
// stock counters are not started again at zero: the grants that need them
// answer ErrRebuilding until they are rebuilt from wallet.grants and
// wallet.tokens, and then the campaign goes on to exactly its limits.
// Without the rebuild the same run accepted about twice the budget.
func TestRedisLossOverspendsNothing(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		const (
			budget    = 30_000 // cents in the phase, cash and coupons together
			cashEach  = 100
			cashGrant = 3 * 250 // three times what the cash part of the budget allows
			couponsIn = 3 * 200 // three times the coupon stock
			stockOf   = 200
		)
		ns := streamstest.Unique("loss") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, ns+schemas.TopicGrants, ns+schemas.TopicTokens)
		now := time.Now()
		tree := &config.Tree{Activities: []config.Activity{{ID: "spring",
			Children: []config.Child{{ID: "spring-live", Phase: config.PhaseOfficial, Start: now.Add(-time.Hour), End: now.Add(time.Hour), Budget: budget}},
			Scenes: []config.Scene{{ID: "rain", Award: "cash", MaxAmount: 1000},
				{ID: "coupon", Award: "coupon", MaxAmount: 1, Template: "t1", Stock: stockOf, Switches: config.Switches{StockControl: true}}}}}}
		keys, err := token.Generate("k1")
		if err != nil {
			t.Fatal(err)
		}
		in := grant.New(grant.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: ns, Log: quiet}, Source: config.Static(tree),
			Keys: keys, Redis: rdb, Producer: streamstest.Client(t, b.Kafka, kgo.ProducerLinger(time.Millisecond)),
			RebuildSettle: 300 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := in.EnsureCounters(ctx); err != nil {
			t.Fatal(err)
		}

		var (
			mu                  sync.Mutex
			cash, coupons       int64 // accepted
			rebuilding, refused int
			acceptedCoupons     []*pb.RewardGrant
			lost                sync.Once
			lostAt              = make(chan struct{})
		)
		// one grants until it has a final answer, as a client retries.
		one := func(g *pb.RewardGrant) {
			for ctx.Err() == nil {
				_, err := in.Grant(ctx, g)
				mu.Lock()
				switch {
				case err == nil:
					if g.AwardType == pb.AwardType_CASH {
						cash += g.Amount
					} else {
						coupons += g.Amount
						acceptedCoupons = append(acceptedCoupons, g)
					}
				case errors.Is(err, grant.ErrRebuilding):
					rebuilding++
				case errors.Is(err, grant.ErrOverBudget), errors.Is(err, stock.ErrOut), errors.Is(err, stock.ErrLow):
					refused++
				default:
					mu.Unlock()
					t.Errorf("grant %s: %v", g.OrderNo, err)
					return
				}
				again := errors.Is(err, grant.ErrRebuilding)
				half := cash+coupons >= budget/2
				mu.Unlock()
				if half {
					lost.Do(func() { loseWalletState(t, ctx, rdb, ns); close(lostAt) })
				}
				if !again {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		grants := make(chan *pb.RewardGrant)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g := range grants {
					one(g)
				}
			}()
		}
		for i := range max(cashGrant, couponsIn) {
			act := fmt.Sprintf("u%d", i%37)
			if i < cashGrant {
				n := order.Number{ActID: act, SceneID: "rain", RainID: fmt.Sprintf("r%d", i), AwardType: pb.AwardType_CASH, Stage: 1}
				grants <- &pb.RewardGrant{OrderNo: n.String(), ActId: act, ActivityId: "spring", SceneId: "rain", RainId: n.RainID,
					AwardType: pb.AwardType_CASH, Stage: 1, Amount: cashEach, AppId: "app"}
			}
			if i < couponsIn {
				n := order.Number{ActID: act, SceneID: "coupon", RainID: fmt.Sprintf("c%d", i), AwardType: pb.AwardType_COUPON, Stage: 1}
				grants <- &pb.RewardGrant{OrderNo: n.String(), ActId: act, ActivityId: "spring", SceneId: "coupon", RainId: n.RainID,
					AwardType: pb.AwardType_COUPON, Stage: 1, Amount: 1, AppId: "app"}
			}
		}
		close(grants)
		wg.Wait()
		select {
		case <-lostAt:
		default:
			t.Fatal("the campaign never reached half its budget: Redis was never lost")
		}

		sellable := int64(stockOf - stockOf*5/100) // less the 5% buffer
		t.Logf("accepted %d cents cash + %d coupons of a %d budget and %d sellable coupons; %d answers were 'rebuilding', %d refusals",
			cash, coupons, budget, sellable, rebuilding, refused)
		if rebuilding == 0 {
			t.Error("no grant was held back while the counters were missing")
		}
		if cash+coupons > budget {
			t.Errorf("accepted %d cents against a budget of %d: overspent by %d", cash+coupons, budget, cash+coupons-budget)
		}
		if coupons > sellable {
			t.Errorf("issued %d coupons against %d sellable: %d past the stock", coupons, sellable, coupons-sellable)
		}
		// The campaign went on after the loss, to its limits: the whole
		// budget, less what no cash grant of 100 fits in.
		if cash+coupons <= budget-cashEach {
			t.Errorf("accepted only %d of the %d budget: the campaign stopped at the loss", cash+coupons, budget)
		}
		// Every coupon accepted, before the loss or after, is a duplicate
		// when retried: its order claim was rebuilt too, so no retry takes
		// budget or stock again.
		for _, g := range acceptedCoupons {
			again := proto.Clone(g).(*pb.RewardGrant)
			again.ActivityId = "spring"
			res, err := in.Grant(ctx, again)
			if err != nil || !res.Duplicate {
				t.Fatalf("coupon %s retried after the loss: %+v %v, want a duplicate", g.OrderNo, res, err)
			}
		}
		// What was published is what was accepted: the topics, which the
		// counters are rebuilt from, agree with the answers.
		var pubCash, pubCoupons int64
		seen := map[string]bool{}
		for _, topic := range []string{ns + schemas.TopicGrants, ns + schemas.TopicTokens} {
			_ = streams.ReadToEnd(ctx, b.Kafka, topic, func(r *kgo.Record) error {
				var tk pb.Token
				var g *pb.RewardGrant
				if strings.HasSuffix(topic, schemas.TopicTokens) {
					if streams.Decode(r, &tk) == nil {
						g = tk.Grant
					}
				} else {
					g = &pb.RewardGrant{}
					if streams.Decode(r, g) != nil {
						g = nil
					}
				}
				if g != nil && !seen[g.OrderNo] {
					seen[g.OrderNo] = true
					if g.AwardType == pb.AwardType_CASH {
						pubCash += g.Amount
					} else {
						pubCoupons += g.Amount
					}
				}
				return nil
			})
		}
		if pubCash != cash || pubCoupons != coupons {
			t.Errorf("published %d cash and %d coupons, accepted %d and %d", pubCash, pubCoupons, cash, coupons)
		}
	})
}

// loseWalletState deletes every Redis key of the wallet namespace ns, as a
// Redis restarted empty would (the test's Redis is shared with other tests,
// so it is not flushed whole).
func loseWalletState(t *testing.T, ctx context.Context, rdb redis.UniversalClient, ns string) {
	keys, err := connect.Scan(ctx, rdb, ns+"*")
	if err != nil {
		t.Error(err)
		return
	}
	for _, k := range keys {
		rdb.Del(ctx, k)
	}
	t.Logf("Redis lost the wallet's %d keys", len(keys))
}
