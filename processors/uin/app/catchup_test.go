package app_test

import (
	"context"
	"fmt"
	"slices"
	"surge/processors/uin/tracker"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/app"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// A login published well before a ticket's grant, but behind a backlog of
// other usage on its partition, is seen before the grant is applied: the
// controller reads its usage partition up to the broker's end before a
// grant or a ban, so the active user is never banned (the ticket is
// refused at its grant: a STOPPED step). Without the catch-up the grant and the ban ran
// first and the login stopped the ticket only when the consumer reached it.
func TestLoginPublishedBeforeAGrantIsSeenByIt(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		// Small batches: the usage backlog takes many, and the grants are
		// fetched long before the consumer reaches the logins behind it.
		s := newStack(t, b, rdb, app.Options{Policy: testPolicy(time.Minute), NoTracker: true,
			StreamOpts: []streams.Option{streams.MaxBatch(50)}})
		ns := s.Opts.Namespace
		now := time.Now().UnixMilli()
		day := int64(24 * time.Hour / time.Millisecond)
		const first, n = 70_001, 24
		cl := streamstest.Client(t, b.Kafka)
		// A backlog of messages on every partition, then each user's login.
		var recs []*kgo.Record
		for i := range 20_000 {
			u := uint64(90_001 + i%5_000)
			recs = append(recs, rec(t, ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: "message", AtMs: now - day}))
		}
		for u := uint64(first); u < first+n; u++ {
			recs = append(recs, rec(t, ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: recycling.KindLogin, AtMs: now - 1000, Source: "auth"}))
		}
		streamstest.ProduceSync(t, cl, recs...)
		// Then the grants, judged on a check that saw no login since 400
		// days: stale for every one of them.
		streamstest.ProduceSync(t, cl, inactiveGrants(t, s, first, first+n-1)...)
		start(t, s)
		// Every grant is refused at once (a STOPPED step naming the
		// login); no ticket is granted, no account banned.
		got := steps(t, s, n, 3*time.Second)
		for u := uint64(first); u < first+n; u++ {
			if k := kinds(got[u]); !slices.Equal(k, []pb.RecycleStepKind{pb.RecycleStepKind_STOPPED}) {
				t.Errorf("uin %d: steps %v, want only STOPPED (it logged in before the grant was published)", u, k)
			}
		}
	})
}

// Redis loses the bans in the middle of them: the controller notices the
// missing marker of its partitions and bans every uin at BAN again, until
// the same time, from its own state.
func TestBansWrittenAgainAfterRedisLostThem(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		s := newStack(t, b, rdb, app.Options{Policy: testPolicy(time.Minute), NoTracker: true})
		ns := s.Opts.Namespace
		ctx := context.Background()
		const first, n = 80_001, 30
		streamstest.ProduceSync(t, streamstest.Client(t, b.Kafka), inactiveGrants(t, s, first, first+n-1)...)
		start(t, s)
		steps(t, s, 2*n, 0) // granted and banned
		banned := func() (k int) {
			for u := uint32(first); u < first+n; u++ {
				if ok, _, _, err := s.Accounts.Banned(ctx, u); err == nil && ok {
					k++
				}
			}
			return k
		}
		if k := banned(); k != n {
			t.Fatalf("%d of %d banned", k, n)
		}
		_, _, before, _ := s.Accounts.Banned(ctx, first)
		// The loss: every ban and every marker gone.
		keys, err := rdb.Keys(ctx, uinkeys.Prefix(ns)+"ban*").Result()
		if err != nil || len(keys) < n {
			t.Fatalf("%d ban keys (%v)", len(keys), err)
		}
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
		if k := banned(); k != 0 {
			t.Fatalf("%d still banned after the loss", k)
		}
		for deadline := time.Now().Add(30 * time.Second); banned() < n; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d banned again after the loss", banned(), n)
			}
		}
		if _, left, why, _ := s.Accounts.Banned(ctx, first); why != before || left > time.Minute {
			t.Fatalf("ban again: %s left, %q; before: %q", left, why, before)
		}
	})
}

// inactiveGrants are stock-classification grants for uins from..to,
// judged inactive on a check that saw their last login 400 days ago.
func inactiveGrants(t *testing.T, s *app.Stack, from, to uint64) []*kgo.Record {
	t.Helper()
	topic := s.Opts.Namespace + schemas.TopicRecycleReqs
	parts, err := streams.PartitionCount(context.Background(), s.Kafka, topic)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	day := int64(24 * time.Hour / time.Millisecond)
	return batchedGrants(t, topic, parts, from, to, recycling.Inactive, now-400*day, now-500*day)
}

// A registration and the user's first logins are published together, as
// a sign-up flow does: the logins count, even where the tracker's consumer
// reads them first (here: behind a backlog of registrations on every
// partition). Before, the tracker dropped usage of a uin it did not track
// yet as a stock account's; now it reads its registrations partition up
// to the broker's end first.
func TestUsagePublishedWithItsRegistrationCounts(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		s := newStack(t, b, rdb, app.Options{Policy: testPolicy(time.Minute),
			StreamOpts: []streams.Option{streams.MaxBatch(50)}})
		ns := s.Opts.Namespace
		now := time.Now().UnixMilli()
		const first, n, logins = 60_001, 20, 3
		cl := streamstest.Client(t, b.Kafka)
		// Restored accounts' registrations: tracked as handed over at
		// once, no timers; a backlog on every partition.
		var recs []*kgo.Record
		for i := range 10_000 {
			u := uint64(200_001 + i)
			recs = append(recs, rec(t, ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, AtMs: now, Completed: true, Channel: tracker.ChannelRestore}))
		}
		for u := uint64(first); u < first+n; u++ {
			recs = append(recs, rec(t, ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, AtMs: now, Completed: true, Username: fmt.Sprintf("new%d", u)}))
		}
		streamstest.ProduceSync(t, cl, recs...)
		recs = recs[:0]
		for u := uint64(first); u < first+n; u++ {
			for i := range logins {
				recs = append(recs, rec(t, ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: recycling.KindLogin, AtMs: now + int64(i), Source: "auth"}))
			}
		}
		streamstest.ProduceSync(t, cl, recs...)
		start(t, s)
		loginsOf := func(u uint64) int64 {
			tr, err := s.Tracker.Get(uint32(u))
			if err != nil || tr == nil {
				return -1
			}
			return tr.Logins
		}
		for u := uint64(first); u < first+n; u++ {
			for deadline := time.Now().Add(60 * time.Second); loginsOf(u) != logins; time.Sleep(50 * time.Millisecond) {
				if got := loginsOf(u); got > logins || time.Now().After(deadline) {
					t.Fatalf("uin %d: %d logins tracked, want %d (published with its registration)", u, got, logins)
				}
			}
		}
		// Read again by the consumer after the catch-up, they count once.
		time.Sleep(time.Second)
		for u := uint64(first); u < first+n; u++ {
			if got := loginsOf(u); got != logins {
				t.Fatalf("uin %d: %d logins tracked, want %d", u, got, logins)
			}
		}
	})
}

// A registration backfilled from an older system arrives with its last
// checkpoint due at once (here: 3 s after it is published, so that the
// user's login, published right after it, is published before the
// checkpoint fires). The login sits behind a backlog of other usage on
// its partition; it is read before the checkpoint is judged, and the
// active user is not judged spam ("no usage after the first day").
// Before, the check was judged on the registration alone.
func TestBackfilledRegistrationJudgedWithItsUsage(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		day := int64(24 * time.Hour / time.Millisecond)
		s := newStack(t, b, rdb, app.Options{Policy: testPolicy(time.Minute),
			Tracker:    tracker.Config{Checkpoints: []time.Duration{30 * 24 * time.Hour}}, // one, the last
			StreamOpts: []streams.Option{streams.MaxBatch(50)}})
		ns := s.Opts.Namespace
		const first, n = 65_001, 20
		cl := streamstest.Client(t, b.Kafka)
		start(t, s)
		// A backlog of stock accounts' usage on every partition.
		var recs []*kgo.Record
		now := time.Now().UnixMilli()
		for i := range 30_000 {
			u := uint64(90_001 + i%5_000)
			recs = append(recs, rec(t, ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: tracker.KindMessage, AtMs: now - day}))
		}
		streamstest.ProduceSync(t, cl, recs...)
		// The registrations, then (acknowledged after them) each user's
		// login, ten days after registering.
		registered := time.Now().Add(3*time.Second).UnixMilli() - 30*day
		recs = recs[:0]
		for u := uint64(first); u < first+n; u++ {
			recs = append(recs, rec(t, ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, AtMs: registered, Completed: true, Username: fmt.Sprintf("old%d", u)}))
		}
		streamstest.ProduceSync(t, cl, recs...)
		recs = recs[:0]
		for u := uint64(first); u < first+n; u++ {
			recs = append(recs, rec(t, ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: recycling.KindLogin, AtMs: registered + 10*day, Source: "auth"}))
		}
		streamstest.ProduceSync(t, cl, recs...)
		verdict := func(u uint64) string {
			tr, err := s.Tracker.Get(uint32(u))
			if err != nil || tr == nil {
				return "untracked"
			}
			return tr.Verdict
		}
		for u := uint64(first); u < first+n; u++ {
			for deadline := time.Now().Add(60 * time.Second); verdict(u) != tracker.HandedOver; time.Sleep(50 * time.Millisecond) {
				if v := verdict(u); v == recycling.Spam || v == recycling.Abandoned || time.Now().After(deadline) {
					t.Fatalf("uin %d: verdict %q, want %q (it logged in 10 days after registering)", u, v, tracker.HandedOver)
				}
			}
		}
	})
}
