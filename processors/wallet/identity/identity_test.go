package identity_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/wallet/identity"
	"surge/processors/wallet/order"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// Phone first: every app account of one phone number is one actID; an
// account without a phone has its own; the actID fits in an order number.
func TestActIDIsPhoneFirst(t *testing.T) {
	a := identity.ActID("+8613800000000", "douyin", "1")
	b := identity.ActID("+8613800000000", "toutiao", "77")
	c := identity.ActID("", "douyin", "1")
	d := identity.ActID("", "toutiao", "1")
	if a != b {
		t.Fatalf("one phone, two apps: %s and %s", a, b)
	}
	if c == a || c == d || c[0] != 'a' || a[0] != 'p' {
		t.Fatalf("without a phone: %s (douyin:1), %s (toutiao:1); with: %s", c, d, a)
	}
	if a != identity.ActID("+8613800000000", "x", "y") || len(a) != 21 {
		t.Fatalf("not stable or not 21 characters: %s", a)
	}
	n := order.Number{ActID: a, SceneID: "rain", RainID: "r1", AwardType: pb.AwardType_CASH, Stage: 1}
	if _, err := order.Parse(n.String()); err != nil {
		t.Fatalf("actID %s in an order number: %v", a, err)
	}
}

// The processor keeps each app account's actID from wallet.identities:
// two apps of one phone resolve to one actID, an account that gets a
// phone later moves to the phone's actID, a tombstone unlinks, and a
// record keyed by anything but its account is dead-lettered.
func TestProcessorKeepsActIDs(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ns := streamstest.Unique("id") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, ns+schemas.TopicIdentities, ns+schemas.TopicDeadLetter)
		runProcessor(t, b, rdb, ns)
		cl := streamstest.Client(t, b.Kafka)
		link := func(app, user, phone string) *kgo.Record {
			r, err := identity.Link(ns, &pb.IdentityLink{App: app, UserId: user, Phone: phone})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		bad := link("douyin", "5", "")
		bad.Key = []byte("douyin:6")
		streamstest.ProduceSync(t, cl, link("douyin", "1", "+8613800000000"), link("toutiao", "77", "+8613800000000"),
			link("douyin", "2", ""), link("toutiao", "3", ""), bad)
		res := identity.NewResolver(rdb, ns)
		want := func(app, user, act string) {
			t.Helper()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				got, err := res.ActID(ctx, app, user)
				if act == "" && errors.Is(err, identity.ErrUnknown) || act != "" && got == act {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s:%s resolves to %q (%v), want %q", app, user, got, err, act)
				}
			}
		}
		phone := identity.ActID("+8613800000000", "", "")
		want("douyin", "1", phone)
		want("toutiao", "77", phone)
		want("douyin", "2", identity.ActID("", "douyin", "2"))
		want("toutiao", "3", identity.ActID("", "toutiao", "3"))
		streamstest.ProduceSync(t, cl, link("douyin", "2", "+8613900000000"), &kgo.Record{Topic: ns + schemas.TopicIdentities, Key: []byte("toutiao:3")})
		want("douyin", "2", identity.ActID("+8613900000000", "", ""))
		want("toutiao", "3", "")
		want("douyin", "6", "")
		dl := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicDeadLetter, false, 1, 30*time.Second, 300*time.Millisecond)
		if len(dl) != 1 {
			t.Fatalf("%d dead letters, want the mis-keyed record", len(dl))
		}
	})
}

// Redis loses the identities: the processor notices the missing marker,
// reads wallet.identities from its start again and every account
// resolves as before (an unlinked one stays unlinked); meanwhile an
// account not found answers ErrRebuilding, never "unknown".
func TestIdentitiesRebuiltAfterRedisLoss(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		ns := streamstest.Unique("idloss") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, ns+schemas.TopicIdentities, ns+schemas.TopicDeadLetter)
		runProcessor(t, b, rdb, ns)
		cl := streamstest.Client(t, b.Kafka)
		var recs []*kgo.Record
		for i := range 50 {
			r, err := identity.Link(ns, &pb.IdentityLink{App: "douyin", UserId: fmt.Sprint(i), Phone: fmt.Sprintf("+86138%08d", i)})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		recs = append(recs, &kgo.Record{Topic: ns + schemas.TopicIdentities, Key: []byte("douyin:7")}) // unlinked
		streamstest.ProduceSync(t, cl, recs...)
		res := identity.NewResolver(rdb, ns)
		resolves := func(i int) bool {
			act, err := res.ActID(ctx, "douyin", fmt.Sprint(i))
			if i == 7 {
				return errors.Is(err, identity.ErrUnknown)
			}
			return err == nil && act == identity.ActID(fmt.Sprintf("+86138%08d", i), "", "")
		}
		all := func() bool {
			for i := range 50 {
				if !resolves(i) {
					return false
				}
			}
			return true
		}
		for deadline := time.Now().Add(30 * time.Second); !all(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("identities never resolved")
			}
		}
		// The loss.
		keys, err := rdb.Keys(ctx, ns+"wid*").Result()
		if err != nil || len(keys) == 0 {
			t.Fatalf("keys %v: %v", keys, err)
		}
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := res.ActID(ctx, "douyin", "3"); !errors.Is(err, identity.ErrRebuilding) && err != nil {
			t.Fatalf("an account lost with Redis: %v, want ErrRebuilding until the rebuild (or its actID after it)", err)
		}
		for deadline := time.Now().Add(30 * time.Second); !all(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("identities not rebuilt after the loss")
			}
		}
	})
}

// runProcessor runs wallet-identities on namespace ns until the test ends.
func runProcessor(t *testing.T, b streamstest.Backend, rdb *redis.Client, ns string) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := identity.New(identity.Config{Env: streams.Env{Kafka: b.Kafka, Namespace: ns, Log: quiet}, Redis: rdb})
	done := make(chan error, 1)
	ctx, stop := context.WithCancel(context.Background())
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
}
