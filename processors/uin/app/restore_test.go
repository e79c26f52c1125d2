package app_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/account"
	"surge/processors/uin/app"
	"surge/processors/uin/restore"
	"surge/processors/uin/tracker"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// TestRestoreBothWays recycles two accounts, lets somebody else take one of
// the uins, and restores both through the uin-restore service (requests on
// uin.restore-requests, answers on uin.restore-results): one onto its old
// uin, one onto a new uin, each with its profile, moments and friends. A
// request consumed again after a crash restores onto the same uin; a new
// request for a live account, one without a backup and malformed ones are
// refused.
func TestRestoreBothWays(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		s := newStack(t, b, rdb, app.Options{Policy: testPolicy(100 * time.Millisecond),
			Components: []string{app.Tracker, app.Recycle, app.Timers, app.Restore}})
		ns := s.Opts.Namespace
		ctx := context.Background()
		now := time.Now().UnixMilli()
		// Carol's friends are bob and erin, who stay. A friend recycled in
		// the same run (alice) would be dropped from carol's backup or not
		// depending on which of the two reached its backup step first
		// (Store.Backup drops friends whose account is gone).
		for _, a := range []account.Account{{Uin: 6002, Username: "bob"}, {Uin: 6004, Username: "erin"}} {
			if err := s.Accounts.Create(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
		var recs []*kgo.Record
		for _, a := range []account.Account{
			{Uin: 6001, Username: "alice", Profile: map[string]string{"nick": "Al"}, Friends: []uint32{6002}, Moments: []string{"hello", "spring"}},
			{Uin: 6003, Username: "carol", Profile: map[string]string{"nick": "C"}, Friends: []uint32{6002, 6004}},
		} {
			if err := s.Accounts.Create(ctx, a); err != nil {
				t.Fatal(err)
			}
			u := uint64(a.Uin)
			recs = append(recs, rec(t, ns+schemas.TopicRegistrations, u, &pb.UinRegistration{Uin: u, Username: a.Username, AtMs: now, Completed: true}))
			for i := range 3 {
				recs = append(recs, rec(t, ns+schemas.TopicUsage, u, &pb.UsageEvent{Uin: u, Kind: tracker.KindSpamReport, AtMs: now + int64(i)}))
			}
		}
		streamstest.ProduceSync(t, streamstest.Client(t, b.Kafka), recs...)
		// Spare uins in the pool for a reused uin's owner.
		if _, err := s.Pool.Insert(ctx, []uint32{9001, 9002, 9003}); err != nil {
			t.Fatal(err)
		}
		start(t, s)
		got := steps(t, s, 12, time.Second)
		for _, u := range []uint64{6001, 6003} {
			if k := kinds(got[u]); !slices.Equal(k, fullCycle) {
				t.Fatalf("uin %d: %v", u, k)
			}
		}
		// Dave gets 6003 (it was pooled).
		if ok, err := s.Pool.Claim(ctx, 6003); err != nil || !ok {
			t.Fatalf("claim 6003 for dave: %v %v", ok, err)
		}
		if err := s.Accounts.Create(ctx, account.Account{Uin: 6003, Username: "dave"}); err != nil {
			t.Fatal(err)
		}

		cl := streamstest.Client(t, b.Kafka)
		ask := func(id, username string) *pb.RestoreResult {
			t.Helper()
			from, err := streams.EndOffsets(ctx, cl, ns+schemas.TopicRestoreResults)
			if err != nil {
				t.Fatal(err)
			}
			streamstest.ProduceSync(t, cl, restore.Request(ns, id, username, "test", time.Now()))
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			res, err := restore.AwaitResult(wctx, b.Kafka, ns, id, from)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		al := ask("req-alice", "alice")
		if al.Error != "" {
			t.Fatal(al.Error)
		}
		if al.Uin != 6001 || al.Reused || al.Friends != 1 {
			t.Errorf("alice: %+v, want back on 6001 with her friend", al)
		}
		a, err := s.Accounts.Load(ctx, uint32(al.Uin))
		if err != nil || a.Username != "alice" || a.Profile["nick"] != "Al" || !slices.Equal(a.Moments, []string{"hello", "spring"}) || !slices.Equal(a.Friends, []uint32{6002}) {
			t.Errorf("alice restored as %+v (%v)", a, err)
		}
		if in, _ := rdb.SIsMember(ctx, uinkeys.Pool(ns)+"bucket:1", 6001).Result(); in {
			t.Error("6001 still in the pool after alice got it back")
		}

		ca := ask("req-carol", "carol")
		if ca.Error != "" {
			t.Fatal(ca.Error)
		}
		if !ca.Reused || ca.Uin == 6003 || ca.Uin < 9001 || ca.Uin > 9003 || ca.Friends != 2 {
			t.Errorf("carol: %+v, want a new uin from the pool and both friends", ca)
		}
		c, err := s.Accounts.Load(ctx, uint32(ca.Uin))
		if err != nil || c.Username != "carol" || c.Profile["nick"] != "C" || !slices.Equal(c.Friends, []uint32{6002, 6004}) {
			t.Errorf("carol restored as %+v (%v)", c, err)
		}
		if d, err := s.Accounts.Load(ctx, 6003); err != nil || d.Username != "dave" {
			t.Errorf("dave's account on 6003 disturbed: %+v (%v)", d, err)
		}
		if inUse, _ := s.Pool.InUse(ctx, uint32(ca.Uin)); !inUse {
			t.Errorf("carol's new uin %d not marked in use", ca.Uin)
		}

		// Carol's request run again (the service crashed after its Redis
		// work, before its commit): the same uin, none more taken.
		size, err := s.Pool.Size(ctx)
		if err != nil {
			t.Fatal(err)
		}
		again, err := s.RestoreTool().Restore(ctx, "req-carol", "carol")
		if err != nil || uint64(again.Uin) != ca.Uin || !again.Reused {
			t.Errorf("carol's request run again: %+v, %v; want uin %d", again, err, ca.Uin)
		}
		if after, _ := s.Pool.Size(ctx); after != size {
			t.Errorf("the pool went from %d to %d uins on a repeated request", size, after)
		}

		if res := ask("req-alice-2", "alice"); !strings.Contains(res.Error, restore.ErrLive.Error()) {
			t.Errorf("restoring a live account: %+v", res)
		}
		if res := ask("req-nobody", "nobody"); !strings.Contains(res.Error, restore.ErrNoBackup.Error()) {
			t.Errorf("restoring without a backup: %+v", res)
		}
		// Malformed requests go to the dead letters with a reason.
		bad := restore.Request(ns, "", "erin", "test", time.Now()) // no request id
		miskeyed := restore.Request(ns, "req-x", "erin", "test", time.Now())
		miskeyed.Key = []byte("someone-else")
		garbage := restore.Request(ns, "req-y", "erin", "test", time.Now())
		garbage.Value = []byte{0xff, 0x01}
		streamstest.ProduceSync(t, cl, bad, miskeyed, garbage)
		if dead := streamstest.ReadN(t, b.Kafka, ns+schemas.TopicDeadLetter, true, 3, 30*time.Second, time.Second); len(dead) != 3 {
			t.Errorf("%d dead letters, want the 3 malformed requests", len(dead))
		}
		// Both restores are announced as registrations.
		var restored []string
		for _, r := range streamstest.ReadN(t, b.Kafka, ns+schemas.TopicRegistrations, true, 6, 10*time.Second, time.Second) {
			var g pb.UinRegistration
			if err := streams.Decode(r, &g); err != nil {
				t.Fatal(err)
			}
			if g.Channel == tracker.ChannelRestore {
				restored = append(restored, fmt.Sprintf("%s@%d", g.Username, g.Uin))
			}
		}
		if want := []string{"alice@6001", fmt.Sprintf("carol@%d", ca.Uin)}; !slices.Equal(slices.Sorted(slices.Values(restored)), want) {
			t.Errorf("restore registrations %v, want %v", restored, want)
		}
	})
}
