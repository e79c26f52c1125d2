package recycle

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/processors/uin/account"
	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas/recycling"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/metrics"
)

// A step counts in surge_uin_recycle_steps_total when its batch commits,
// not when it is applied: a batch aborted (and processed again) counts
// once.
func TestStepsCountedWhenTheirBatchCommits(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	central := pool.NewCentral(rdb, uinkeys.Pool("m."), 16)
	if err := central.Restore(ctx, pool.NewFold(16), nil); err != nil {
		t.Fatal(err)
	}
	db, err := openDB(t.TempDir(), quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	reg := metrics.NewRegistry()
	now := time.Now()
	c := New(Config{Env: streams.Env{Namespace: "m.", Now: func() time.Time { return now }, Log: quiet, Metrics: reg},
		Accounts: account.NewStore(rdb, uinkeys.Prefix("m.")), Pool: central})
	c.committed = newCommitted(db, 2)
	c.staged, c.restored = newStore(c.committed), newStore(c.committed)
	c.partitions = 1
	grant := recycling.Grant(recycling.Finding{Uin: 7, Category: recycling.Abandoned, Reason: "test", LastLoginMs: 0, RegisteredAtMs: 1}, now)
	run := func(commit bool) {
		s := &step{c: c, ctx: ctx, out: &streams.Output{}, now: now}
		if err := s.request(grant); err != nil {
			t.Fatal(err)
		}
		c.batchEnd(commit)
	}
	granted := c.mApplied.With(pb.RecycleStepKind_TICKET_GRANTED.String())
	run(false) // the transaction aborted
	if v := granted.Value(); v != 0 {
		t.Fatalf("an aborted batch counted %v grants", v)
	}
	run(true) // processed again, committed
	if v := granted.Value(); v != 1 {
		t.Fatalf("%v grants counted, want 1", v)
	}
}
