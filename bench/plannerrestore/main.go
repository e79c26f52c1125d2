// Command plannerrestore measures how long the push planner takes to
// rebuild its memory, as on a start or a fail-over: by replaying every
// transition (and reading the filtered package of every job queued in
// them), against loading its newest checkpoint and replaying only the
// transitions after it.
//
// It writes a history of -jobs finished jobs (nine transitions each, as
// the planner writes them, each job's filtered package a distinct set of
// -targets uins on push.packages), lets a planner restore it and write a
// checkpoint, adds -tail more jobs after the checkpoint, then restores
// twice: with checkpoints off and on.
//
//	go run ./bench/plannerrestore -jobs 20000                          # kfake
//	go run ./bench/plannerrestore -jobs 20000 -brokers 127.0.0.1:19092 # real broker
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/push/numpkg"
	"surge/processors/push/planner"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/embedded"
)

func main() {
	brokersFlag := flag.String("brokers", "", "real broker(s); empty starts kfake in process")
	jobs := flag.Int("jobs", 20_000, "finished jobs in the history before the checkpoint")
	tail := flag.Int("tail", 500, "jobs after the checkpoint")
	targets := flag.Int("targets", 2_000, "uins in each job's filtered package")
	flag.Parse()

	kc, backend, stopKafka, err := embedded.KafkaOr(*brokersFlag)
	must(err)
	defer stopKafka()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "bench-plannerrestore-")
	must(err)
	defer os.RemoveAll(dir)
	ns := fmt.Sprintf("bench%d.", time.Now().UnixNano())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	admin, err := kc.NewClient(kgo.ProducerBatchMaxBytes(numpkg.ChunkBytes + (64 << 10)))
	must(err)
	defer admin.Close()
	// The history is written as the planner writes it: in transactions.
	writer, err := kc.NewClient(kgo.ProducerBatchMaxBytes(numpkg.ChunkBytes+(64<<10)),
		kgo.TransactionalID(ns+"history"))
	must(err)
	defer writer.Close()
	must(streams.EnsureTopics(ctx, admin, streams.OneCopy, schemas.Namespaced(ns, schemas.TopicJobs, schemas.TopicJobTransitions,
		schemas.TopicPlannerCkpt, schemas.TopicExecutors, schemas.TopicReports, schemas.TopicPackages, schemas.TopicAccounts,
		schemas.TopicFanDelta, schemas.TopicTags, schemas.TopicBlacklists, schemas.TopicJobClicks, schemas.TopicTimers,
		schemas.TopicDeadLetter)...))
	pkgs, err := numpkg.OpenTopicStore(ctx, kc, ns+schemas.TopicPackages, filepath.Join(dir, "packages"), log)
	must(err)

	at := time.Now().Add(-time.Hour)
	history := func(from, n int) int {
		var recs []*kgo.Record
		flush := func() {
			must(writer.BeginTransaction())
			must(writer.ProduceSync(ctx, recs...).FirstErr())
			must(writer.EndTransaction(ctx, kgo.TryCommit))
			recs = recs[:0]
		}
		written := 0
		for i := from; i < from+n; i++ {
			id := fmt.Sprintf("job-%07d", i)
			set := roaring.New()
			base := uint64(i) * uint64(*targets)
			set.AddRange(base, base+uint64(*targets))
			data, err := numpkg.Encode(set)
			must(err)
			recs = append(recs, numpkg.Chunks(ns+schemas.TopicPackages, id+".filtered", data)...)
			j := &pb.SendJob{JobId: id, AccountId: 1, Source: pb.TargetSource_FOLLOWERS, ContentId: id, ContentCrc: uint32(i),
				PackageUri: numpkg.TopicURI(ns+schemas.TopicPackages, id+".filtered"), CreatedAtMs: at.UnixMilli()}
			from := pb.JobState_JOB_STATE_UNSPECIFIED
			for _, to := range []pb.JobState{pb.JobState_CREATED, pb.JobState_VALIDATING, pb.JobState_FETCHING_TARGETS,
				pb.JobState_PACKAGE_READY, pb.JobState_FILTERING, pb.JobState_QUEUED, pb.JobState_DISPATCHING,
				pb.JobState_SENDING, pb.JobState_COMPLETED} {
				t := &pb.JobTransition{JobId: id, From: from, To: to, AtMs: at.UnixMilli()}
				switch to {
				case pb.JobState_PACKAGE_READY, pb.JobState_QUEUED:
					t.Job, t.Targets = j, uint64(*targets)
				case pb.JobState_SENDING, pb.JobState_COMPLETED:
					t.Position = 1
				}
				r, err := streams.NewRecord(ns+schemas.TopicJobTransitions, []byte(id), t)
				must(err)
				recs = append(recs, r)
				from = to
				written++
			}
			if len(recs) >= 5000 {
				flush()
			}
		}
		flush()
		return written
	}

	fmt.Printf("# planner restore: %d finished jobs (%d-uin filtered packages), then %d after the checkpoint; %s\n", *jobs, *targets, *tail, backend)
	began := time.Now()
	before := history(0, *jobs)
	fmt.Printf("history written: %d transitions in %s\n", before, time.Since(began).Round(time.Millisecond))

	// A planner that runs long enough to write a checkpoint (a heartbeat
	// on push.executors gives it batches).
	cfg := planner.DefaultConfig()
	cfg.CheckpointEvery = 100 * time.Millisecond
	cfg.Env, cfg.Packages = streams.Env{Kafka: kc, Namespace: ns, Log: log}, pkgs
	live := planner.New(cfg)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- live.Run(rctx, streams.Logger(log), streams.InstanceID("bench")) }()
	ckpt := waitCheckpoint(ctx, kc, admin, ns)
	stop()
	<-done
	fmt.Printf("checkpoint written: %d bytes\n", ckpt)

	after := history(*jobs, *tail)
	for _, every := range []time.Duration{0, time.Minute} {
		c := cfg
		c.CheckpointEvery = every
		p := planner.New(c)
		must(p.Restore(ctx))
		st := p.LastRestore()
		how := "full replay"
		if st.FromCheckpoint {
			how = "checkpoint + tail"
		}
		fmt.Printf("restore, %-17s %7d of %7d transitions in %7s (%.0f jobs/s of history)\n", how+":", st.Transitions, before+after,
			st.Took.Round(time.Millisecond), float64(*jobs+*tail)/st.Took.Seconds())
	}
	cancel()
	time.Sleep(300 * time.Millisecond)
	_ = pkgs.Close()
}

// waitCheckpoint feeds the planner heartbeats until it has written a
// checkpoint, and returns the checkpoint's size.
func waitCheckpoint(ctx context.Context, kc streams.Cluster, cl *kgo.Client, ns string) int {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		r, err := streams.NewRecord(ns+schemas.TopicExecutors, []byte("x"), &pb.ExecutorLoad{Executor: "x",
			UnitsTopic: ns + schemas.TopicUnits + ".x", AtMs: time.Now().UnixMilli()})
		must(err)
		must(cl.ProduceSync(ctx, r).FirstErr())
		size := 0
		_ = streams.ReadToEnd(ctx, kc, ns+schemas.TopicPlannerCkpt, func(r *kgo.Record) error {
			size += len(r.Value)
			return nil
		})
		if size > 0 {
			return size
		}
		time.Sleep(200 * time.Millisecond)
	}
	panic("no checkpoint written")
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "plannerrestore:", err)
		os.Exit(1)
	}
}
