package pipeline_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/pipeline"
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
		s := newStack(t, b, rdb, pipeline.Options{Policy: testPolicy(time.Minute), NoTracker: true,
			StreamOpts: []streams.Option{streams.MaxBatch(50)}})
		ns := s.Opts.Namespace
		ctx := context.Background()
		parts, err := streams.PartitionCount(ctx, b.Kafka, ns+schemas.TopicRecycleReqs)
		if err != nil {
			t.Fatal(err)
		}
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
		streamstest.ProduceSync(t, cl, batchedGrants(t, ns+schemas.TopicRecycleReqs, parts, first, first+n-1, recycling.Inactive, now-400*day, now-500*day)...)
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
