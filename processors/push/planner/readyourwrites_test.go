package planner

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/directory"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// TestJobSeesFollowsPublishedBeforeIt: a platform publishes follows on
// push.fan-delta, has them acknowledged, and at once publishes a job for
// the account's followers. The planner reads the two topics with no order
// between them; the job must still be planned with every follower
// published before it, twenty times over.
func TestJobSeesFollowsPublishedBeforeIt(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		e := newTestEnv(t, b, 0)
		cfg := DefaultConfig()
		cfg.Now = lateClock()
		p := New(withEnv(cfg, e.kafka, e.pkgs, e.ns, e.log))
		stop := e.run(p)
		defer stop()
		// The planner is up and consuming before the rounds start.
		e.send(schemas.TopicJobs, "warm-up", &pb.SendJob{JobId: "warm-up", AccountId: 7, Source: pb.TargetSource_TAGS, Tags: []string{"none"}})
		for p.State("warm-up") == pb.JobState_JOB_STATE_UNSPECIFIED && e.ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}

		const rounds, perRound = 20, 5000
		for round := range rounds {
			account := uint64(100 + round) // its own followers: a job sees exactly them
			recs := []*kgo.Record{directory.AccountRecord(e.ns, &pb.AccountInfo{AccountId: account, Type: "subscription"})}
			for u := range uint32(perRound) {
				recs = append(recs, directory.FollowRecord(e.ns, account, u+1, true))
			}
			streamstest.ProduceSync(t, e.admin, recs...)
			e.send(schemas.TopicJobs, "", &pb.SendJob{JobId: fmt.Sprintf("after-follows-%d", round), AccountId: account,
				Source: pb.TargetSource_FOLLOWERS, ContentId: "c", ContentCrc: uint32(round + 1)})
		}

		targets := map[string]uint64{}
		streamstest.ReadUntil(t, e.kafka, e.ns+schemas.TopicJobTransitions, true, func(recs []*kgo.Record) bool {
			for _, r := range recs {
				var tr pb.JobTransition
				if streams.Decode(r, &tr) == nil && tr.To == pb.JobState_PACKAGE_READY {
					targets[tr.JobId] = tr.Targets
				}
			}
			return len(targets) >= rounds
		}, 2*time.Minute, 0)
		for round := range rounds {
			id := fmt.Sprintf("after-follows-%d", round)
			if targets[id] != perRound {
				t.Errorf("job %s planned for %d followers, want the %d followed before it", id, targets[id], perRound)
			}
		}
	})
}
