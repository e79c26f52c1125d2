package streams_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/embedded"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func uinKey(u uint64) []byte { return binary.BigEndian.AppendUint32(nil, uint32(u)) }

func loginRecord(t testing.TB, topic string, uin uint64) *kgo.Record {
	r, err := streams.NewRecord(topic, uinKey(uin), &surgev1.LoginEvent{Uin: uin, Online: true, AtMs: int64(uin)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// echo copies each login event to out, marking it processed via Device.
func echo(out string) streams.Handler {
	return streams.Typed(func(_ context.Context, in *kgo.Record, ev *surgev1.LoginEvent, o *streams.Output) error {
		ev.Device = "seen"
		return o.EmitMsg(out, in.Key, ev)
	})
}

// countUins decodes output records and counts each uin.
func countUins(t testing.TB, recs []*kgo.Record) map[uint64]int {
	t.Helper()
	seen := map[uint64]int{}
	for _, r := range recs {
		var ev surgev1.LoginEvent
		if err := streams.Decode(r, &ev); err != nil {
			t.Fatalf("output does not decode: %v", err)
		}
		seen[ev.Uin]++
	}
	return seen
}

// assertExactlyOnce checks every uin in [0,n) appears exactly once.
func assertExactlyOnce(t testing.TB, seen map[uint64]int, n int) {
	t.Helper()
	var missing, dup int
	for u := 0; u < n; u++ {
		switch c := seen[uint64(u)]; {
		case c == 0:
			missing++
		case c > 1:
			dup++
		}
	}
	if missing > 0 || dup > 0 || len(seen) != n {
		t.Fatalf("want each of %d uins once: %d missing, %d duplicated, %d distinct", n, missing, dup, len(seen))
	}
}

func runInBackground(t *testing.T, r *streams.Runner) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(60 * time.Second):
				t.Error("runner did not stop within 60s")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestTransactionsCommitOrAbort(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		topic := streamstest.Unique("txn")
		streamstest.CreateTopics(t, b.Kafka, 1, topic)
		cl := streamstest.Client(t, b.Kafka, kgo.TransactionalID(streamstest.Unique("txn-id")))
		ctx := context.Background()

		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10; i++ {
			cl.Produce(ctx, loginRecord(t, topic, uint64(i)), nil)
		}
		if err := cl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 100; i < 105; i++ {
			cl.Produce(ctx, loginRecord(t, topic, uint64(i)), nil)
		}
		if err := cl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}

		committed := countUins(t, streamstest.ReadN(t, b.Kafka, topic, true, 5, 20*time.Second, time.Second))
		if len(committed) != 5 {
			t.Fatalf("read_committed sees %d records, want the 5 committed: %v", len(committed), committed)
		}
		for u := range committed {
			if u < 100 {
				t.Fatalf("aborted record %d visible to read_committed", u)
			}
		}
		all := streamstest.ReadN(t, b.Kafka, topic, false, 15, 20*time.Second, time.Second)
		if len(all) != 15 {
			t.Fatalf("read_uncommitted sees %d records, want 15 (aborted ones included)", len(all))
		}
	})
}

func TestExactlyOnceSurvivesTransientFailures(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		in, out, dlq := streamstest.Unique("in"), streamstest.Unique("out"), streamstest.Unique("dlq")
		streamstest.CreateTopics(t, b.Kafka, 3, in, out, dlq)
		const n = 3000
		cl := streamstest.Client(t, b.Kafka)
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = loginRecord(t, in, uint64(i))
		}
		streamstest.ProduceSync(t, cl, recs...)

		// Fail every 500th record twice: the batch is retried in place and
		// nothing it had emitted before the failure is produced twice.
		var fails sync.Map
		inner := echo(out)
		// State staged per batch, as a stateful processor keeps it: OnRetry
		// must drop what a failed attempt staged, or the records before
		// the failure count twice.
		var staged, retries int
		var committed atomic.Int64
		h := func(ctx context.Context, r *kgo.Record, o *streams.Output) error {
			if r.Offset%500 == 7 {
				v, _ := fails.LoadOrStore(fmt.Sprint(r.Partition, r.Offset), new(atomic.Int32))
				if v.(*atomic.Int32).Add(1) <= 2 {
					return errors.New("injected transient failure")
				}
			}
			staged++
			return inner(ctx, r, o)
		}
		reg := metrics.NewRegistry()
		r, err := streams.New(streamstest.Unique("eos"), h, streams.Kafka(b.Kafka), streams.Inputs(in),
			streams.WithGuarantee(streams.ExactlyOnce), streams.DeadLetterTopic(dlq), streams.MaxBatch(400),
			streams.Backoff(10*time.Millisecond, 50*time.Millisecond), streams.Metrics(reg), streams.Logger(quiet),
			streams.OnRetry(func() { staged, retries = 0, retries+1 }),
			streams.OnBatchEnd(func(ok bool) {
				if ok {
					committed.Add(int64(staged))
				}
				staged = 0
			}))
		if err != nil {
			t.Fatal(err)
		}
		stop := runInBackground(t, r)
		got := streamstest.ReadN(t, b.Kafka, out, true, n, 60*time.Second, 2*time.Second)
		stop()
		assertExactlyOnce(t, countUins(t, got), n)
		if committed.Load() != n || retries == 0 {
			t.Fatalf("state committed for %d records of %d after %d retries", committed.Load(), n, retries)
		}

		var text strings.Builder
		_ = reg.WriteText(&text)
		if !strings.Contains(text.String(), `surge_errors_total{kind="handler_retry",processor=`) {
			t.Fatalf("retries not counted:\n%s", text.String())
		}
	})
}

func TestBadInputGoesToDeadLetterAndProcessingContinues(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		for _, g := range []streams.Guarantee{streams.ExactlyOnce, streams.AtLeastOnce} {
			t.Run(g.String(), func(t *testing.T) {
				in, out, dlq := streamstest.Unique("in"), streamstest.Unique("out"), streamstest.Unique("dlq")
				streamstest.CreateTopics(t, b.Kafka, 1, in, out, dlq)
				cl := streamstest.Client(t, b.Kafka)

				good := func(u uint64) *kgo.Record { return loginRecord(t, in, u) }
				malformed := good(1001)
				malformed.Value = []byte{0xff, 0xff, 0xff}
				noHeader := good(1002)
				noHeader.Headers = nil
				future := good(1003)
				future.Headers[1].Value = []byte("9")
				wrongSchema, _ := streams.NewRecord(in, nil, &surgev1.FanDelta{AccountId: 1})
				oversized := good(1005)
				oversized.Value = make([]byte, 5000)
				outOfRange, _ := streams.NewRecord(in, nil, &surgev1.LoginEvent{Uin: 1 << 33})
				streamstest.ProduceSync(t, cl, good(0), malformed, noHeader, good(1), future, wrongSchema, oversized, outOfRange, good(2))

				h := streams.Typed(func(_ context.Context, r *kgo.Record, ev *surgev1.LoginEvent, o *streams.Output) error {
					if ev.Uin > 0xFFFFFFFF {
						return streams.Reject(fmt.Sprintf("uin %d outside the 32-bit space", ev.Uin), nil)
					}
					return o.EmitMsg(out, r.Key, ev)
				})
				r, err := streams.New(streamstest.Unique("dlq"), h, streams.Kafka(b.Kafka), streams.Inputs(in),
					streams.WithGuarantee(g), streams.DeadLetterTopic(dlq), streams.MaxRecordBytes(1024), streams.Logger(quiet))
				if err != nil {
					t.Fatal(err)
				}
				stop := runInBackground(t, r)
				outs := streamstest.ReadN(t, b.Kafka, out, true, 3, 30*time.Second, time.Second)
				dead := streamstest.ReadN(t, b.Kafka, dlq, true, 6, 30*time.Second, time.Second)
				stop()

				if got := countUins(t, outs); len(outs) != 3 || got[0] != 1 || got[1] != 1 || got[2] != 1 {
					t.Fatalf("good records: %v", got)
				}
				wantReasons := []string{"malformed surge.v1.LoginEvent", "missing schema header", "unknown schema version 9",
					`schema "surge.v1.FanDelta" where "surge.v1.LoginEvent" expected`, "oversized record: 5000 bytes > 1024",
					"outside the 32-bit space"}
				if len(dead) != len(wantReasons) {
					t.Fatalf("%d dead letters, want %d", len(dead), len(wantReasons))
				}
				for i, d := range dead {
					reason, _ := streams.Header(d, streams.HeaderDLQReason)
					if !strings.Contains(reason, wantReasons[i]) {
						t.Errorf("dead letter %d: reason %q, want it to contain %q", i, reason, wantReasons[i])
					}
					if src, _ := streams.Header(d, streams.HeaderDLQTopic); src != in {
						t.Errorf("dead letter %d: source topic %q", i, src)
					}
				}
				if trunc, ok := streams.Header(dead[4], streams.HeaderDLQTruncated); !ok || trunc != "5000" || len(dead[4].Value) != 1024 {
					t.Errorf("oversized dead letter not truncated: %q %d", trunc, len(dead[4].Value))
				}
			})
		}
	})
}

func TestRebalanceBetweenTwoInstancesKeepsExactlyOnce(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		in, out := streamstest.Unique("in"), streamstest.Unique("out")
		streamstest.CreateTopics(t, b.Kafka, 6, in, out)
		cl := streamstest.Client(t, b.Kafka)
		const n = 20000
		name := streamstest.Unique("rebalance")
		// Slow the handler so both instances are busy while the group changes.
		slow := func(ctx context.Context, r *kgo.Record, o *streams.Output) error {
			if r.Offset%100 == 0 {
				time.Sleep(2 * time.Millisecond)
			}
			return echo(out)(ctx, r, o)
		}
		mk := func(id string) *streams.Runner {
			r, err := streams.New(name, slow, streams.Kafka(b.Kafka), streams.Inputs(in),
				streams.WithGuarantee(streams.ExactlyOnce), streams.InstanceID(id), streams.MaxBatch(500),
				streams.Metrics(metrics.NewRegistry()), streams.Logger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		var produced sync.WaitGroup
		produced.Add(1)
		go func() {
			defer produced.Done()
			for i := 0; i < n; i += 1000 {
				batch := make([]*kgo.Record, 0, 1000)
				for u := i; u < i+1000; u++ {
					batch = append(batch, loginRecord(t, in, uint64(u)))
				}
				streamstest.ProduceSync(t, cl, batch...)
				time.Sleep(50 * time.Millisecond)
			}
		}()
		stopA := runInBackground(t, mk("a"))
		time.Sleep(1500 * time.Millisecond)
		stopB := runInBackground(t, mk("b")) // rebalance: a gives up half
		time.Sleep(1500 * time.Millisecond)
		stopA() // graceful leave: b takes everything
		produced.Wait()
		got := streamstest.ReadN(t, b.Kafka, out, true, n, 90*time.Second, 3*time.Second)
		stopB()
		assertExactlyOnce(t, countUins(t, got), n)
	})
}

func TestBrokerDownAtStartIsWaitedFor(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", port)

	var committed atomic.Int64
	r, err := streams.New("late", echo("late-out"), streams.Kafka(streams.Seeds(addr)), streams.Inputs("late-in"),
		streams.Backoff(20*time.Millisecond, 200*time.Millisecond), streams.Metrics(metrics.NewRegistry()),
		streams.Logger(quiet), streams.OnCommit(func(in, _ int) { committed.Add(int64(in)) }))
	if err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, r)
	time.Sleep(700 * time.Millisecond) // the runner is retrying against nothing

	k, err := embedded.StartKafka(embedded.Port(port))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	streamstest.CreateTopics(t, streams.Seeds(k.Brokers()...), 1, "late-in", "late-out")
	streamstest.ProduceSync(t, streamstest.Client(t, streams.Seeds(k.Brokers()...)), loginRecord(t, "late-in", 7))
	got := streamstest.ReadN(t, streams.Seeds(k.Brokers()...), "late-out", true, 1, 30*time.Second, 200*time.Millisecond)
	stop()
	if len(got) != 1 || committed.Load() != 1 {
		t.Fatalf("after the broker came up: %d outputs, %d committed inputs", len(got), committed.Load())
	}
}

// TestCrashMidBatch kills a processor process with SIGKILL several times
// while it works, restarts it each time, and checks the outputs: exactly
// once with transactions; nothing lost (duplicates allowed) at least once.
func TestCrashMidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		for _, g := range []streams.Guarantee{streams.ExactlyOnce, streams.AtLeastOnce} {
			t.Run(g.String(), func(t *testing.T) {
				t.Parallel() // own topics and group; mostly waiting on the kills
				crashTest(t, b, g)
			})
		}
	})
}

func crashTest(t *testing.T, b streamstest.Backend, g streams.Guarantee) {
	in, out := streamstest.Unique("in"), streamstest.Unique("out")
	streamstest.CreateTopics(t, b.Kafka, 3, in, out)
	const n = 30000
	cl := streamstest.Client(t, b.Kafka)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = loginRecord(t, in, uint64(i))
	}
	streamstest.ProduceSync(t, cl, recs...)

	name := streamstest.Unique("crash")
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcessor$", "-test.v")
		cmd.Env = append(os.Environ(), "SURGE_CHILD=1", "SURGE_CHILD_BROKERS="+strings.Join(b.Kafka.Seeds, ","),
			"SURGE_CHILD_IN="+in, "SURGE_CHILD_OUT="+out, "SURGE_CHILD_NAME="+name, "SURGE_CHILD_GUARANTEE="+g.String())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	// Each kill waits for fresh progress on the output, then lands a moment
	// later, so it hits a processor in the middle of its work.
	adm := kadm.NewClient(cl)
	endOffsets := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		offs, err := adm.ListEndOffsets(ctx, out)
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		offs.Each(func(o kadm.ListedOffset) { sum += o.Offset })
		return sum
	}
	for i := 0; i < 3; i++ {
		before := endOffsets()
		cmd := start()
		deadline := time.Now().Add(60 * time.Second)
		for endOffsets() < before+2000 {
			if time.Now().After(deadline) {
				t.Fatal("child made no progress in 60s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(time.Duration(100+150*i) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		done := len(streamstest.ReadN(t, b.Kafka, out, true, n, time.Second, 0))
		if done >= n {
			t.Fatalf("kill %d came after the work was finished; the test proves nothing", i+1)
		}
		t.Logf("kill %d: %d of %d outputs committed", i+1, done, n)
	}
	final := start()
	defer func() { _ = final.Process.Kill(); _ = final.Wait() }()
	got := streamstest.ReadN(t, b.Kafka, out, true, n, 120*time.Second, 3*time.Second)
	seen := countUins(t, got)
	if g == streams.ExactlyOnce {
		assertExactlyOnce(t, seen, n)
		return
	}
	missing, dups := 0, 0
	for u := 0; u < n; u++ {
		if seen[uint64(u)] == 0 {
			missing++
		}
		dups += max(seen[uint64(u)]-1, 0)
	}
	if missing > 0 {
		t.Fatalf("at-least-once lost %d of %d records", missing, n)
	}
	t.Logf("at-least-once: %d duplicates after 3 kills (allowed; downstream is idempotent)", dups)
}

// TestChildProcessor is the processor process of TestCrashMidBatch.
func TestChildProcessor(t *testing.T) {
	if os.Getenv("SURGE_CHILD") != "1" {
		t.Skip("helper process for TestCrashMidBatch")
	}
	g, err := streams.ParseGuarantee(os.Getenv("SURGE_CHILD_GUARANTEE"))
	if err != nil {
		t.Fatal(err)
	}
	// Slow enough that a kill lands inside a batch, not between them.
	slow := func(ctx context.Context, r *kgo.Record, o *streams.Output) error {
		if r.Offset%5 == 0 {
			time.Sleep(time.Millisecond)
		}
		return echo(os.Getenv("SURGE_CHILD_OUT"))(ctx, r, o)
	}
	r, err := streams.New(os.Getenv("SURGE_CHILD_NAME"), slow,
		streams.Kafka(streams.Seeds(strings.Split(os.Getenv("SURGE_CHILD_BROKERS"), ",")...)),
		streams.Inputs(os.Getenv("SURGE_CHILD_IN")), streams.WithGuarantee(g),
		streams.InstanceID("only"), streams.StaticMembership(), streams.MaxBatch(1000),
		streams.TransactionTimeout(10*time.Second), streams.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Run(context.Background()) // runs until killed
}

// The broker goes away in the middle of a run and comes back with its data:
// the processor waits, resumes from its last commit, and the output has
// every record exactly once.
func TestBrokerGoneMidRunLosesAndDuplicatesNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	k, err := embedded.StartKafka(embedded.Port(port), embedded.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	kc := streams.Seeds(k.Brokers()...)
	streamstest.CreateTopics(t, kc, 3, "bounce-in", "bounce-out")
	const n = 20000
	pcl, err := kc.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = loginRecord(t, "bounce-in", uint64(i))
	}
	if err := pcl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	pcl.Close()

	var committed atomic.Int64
	slow := func(ctx context.Context, r *kgo.Record, o *streams.Output) error {
		if r.Offset%10 == 0 {
			time.Sleep(time.Millisecond)
		}
		return echo("bounce-out")(ctx, r, o)
	}
	r, err := streams.New("bounce", slow, streams.Kafka(kc), streams.Inputs("bounce-in"),
		streams.WithGuarantee(streams.ExactlyOnce), streams.InstanceID("b1"), streams.MaxBatch(500),
		streams.Backoff(20*time.Millisecond, 300*time.Millisecond), streams.DeliveryTimeout(5*time.Second),
		streams.Metrics(metrics.NewRegistry()), streams.Logger(quiet),
		streams.OnCommit(func(in, _ int) { committed.Add(int64(in)) }))
	if err != nil {
		t.Fatal(err)
	}
	stop := runInBackground(t, r)
	for committed.Load() < 3000 {
		time.Sleep(10 * time.Millisecond)
	}
	k.Close() // the broker goes away mid-run
	atCrash := committed.Load()
	time.Sleep(1500 * time.Millisecond)
	if atCrash >= n {
		t.Fatalf("all %d records were done before the broker went away", n)
	}
	k, err = embedded.StartKafka(embedded.Port(port), embedded.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	got := streamstest.ReadN(t, streams.Seeds(k.Brokers()...), "bounce-out", true, n, 90*time.Second, 2*time.Second)
	stop()
	t.Logf("broker away after %d of %d committed", atCrash, n)
	assertExactlyOnce(t, countUins(t, got), n)
}

// OnIdle runs on the processing goroutine while no record arrives, so
// state work that needs no traffic (rebuilding an idle partition) gets
// done; it stops with the runner.
func TestOnIdleRunsWithoutTraffic(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		in := streamstest.Unique("idle-in")
		streamstest.CreateTopics(t, b.Kafka, 1, in)
		var idle atomic.Int64
		r, err := streams.New("idle", func(context.Context, *kgo.Record, *streams.Output) error { return nil },
			streams.Kafka(b.Kafka), streams.Inputs(in), streams.Group(streamstest.Unique("idle")),
			streams.WithGuarantee(streams.ExactlyOnce), streams.OnIdle(func(context.Context) { idle.Add(1) }))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		deadline := time.Now().Add(30 * time.Second)
		for idle.Load() < 3 {
			if time.Now().After(deadline) {
				t.Fatalf("OnIdle ran %d times in 30 s without traffic", idle.Load())
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	})
}

// A batch that produces nothing commits only its offsets. Right after a
// commit, a real broker with transactions v2 refuses that with
// CONCURRENT_TRANSACTIONS until the previous transaction's markers are
// written, and franz-go then aborts the batch: every such batch was
// consumed twice, and a processor that rebuilds its memory on an abort
// (the push planner) spent a second on each. The runner waits for the
// previous end first; no batch is aborted.
func TestBatchesWithoutOutputAreNotAborted(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		in, out, dlq := streamstest.Unique("in"), streamstest.Unique("out"), streamstest.Unique("dlq")
		streamstest.CreateTopics(t, b.Kafka, 1, in, out, dlq)
		const n = 300
		// Even uins are echoed, odd ones produce nothing: batches of one
		// record, all waiting, alternate between the two kinds.
		echoEven := echo(out)
		h := func(ctx context.Context, r *kgo.Record, o *streams.Output) error {
			if r.Offset%2 == 1 {
				return nil
			}
			return echoEven(ctx, r, o)
		}
		var aborted, committedIn atomic.Int64
		r, err := streams.New(streamstest.Unique("eos"), h, streams.Kafka(b.Kafka), streams.Inputs(in),
			streams.WithGuarantee(streams.ExactlyOnce), streams.DeadLetterTopic(dlq), streams.MaxBatch(1),
			streams.Metrics(metrics.NewRegistry()), streams.Logger(quiet),
			streams.OnBatchEnd(func(ok bool) {
				if !ok {
					aborted.Add(1)
				}
			}),
			streams.OnCommit(func(in, _ int) { committedIn.Add(int64(in)) }))
		if err != nil {
			t.Fatal(err)
		}
		recs := make([]*kgo.Record, n)
		for i := range recs {
			recs[i] = loginRecord(t, in, uint64(i))
		}
		streamstest.ProduceSync(t, streamstest.Client(t, b.Kafka), recs...)
		runInBackground(t, r)
		got := streamstest.ReadN(t, b.Kafka, out, true, n/2, 60*time.Second, time.Second)
		deadline := time.Now().Add(30 * time.Second)
		for committedIn.Load() < n && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if c := committedIn.Load(); c != n {
			t.Fatalf("%d of %d inputs committed", c, n)
		}
		seen := countUins(t, got)
		for u := range uint64(n) {
			if want := int(1 - u%2); seen[u] != want {
				t.Fatalf("uin %d echoed %d times, want %d", u, seen[u], want)
			}
		}
		if a := aborted.Load(); a != 0 {
			t.Fatalf("%d batches aborted", a)
		}
	})
}

// TestTakeOverFencesADeadInstancesTransaction: an instance killed with -9
// in the middle of a transaction leaves it open, and its output holds back
// every read-committed reader of that partition until the broker times it
// out (here 60 s). The instance that takes over fences it within seconds:
// the outputs are readable again, and the dead one's record was aborted.
func TestTakeOverFencesADeadInstancesTransaction(t *testing.T) {
	b := streamstest.RealBroker(t)
	in, out := streamstest.Unique("in"), streamstest.Unique("out")
	streamstest.CreateTopics(t, b.Kafka, 1, in, out)
	name := streamstest.Unique("fence")
	dead, err := b.Kafka.NewClient(kgo.TransactionalID(name+"-dead"), kgo.TransactionTimeout(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dead.Close) // never ends its transaction: as good as killed
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dead.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := dead.ProduceSync(ctx, loginRecord(t, out, 1_000_000)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := streamstest.Client(t, b.Kafka)
	const n = 100
	for u := range n {
		streamstest.ProduceSync(t, cl, loginRecord(t, in, uint64(u)))
	}
	start := time.Now()
	r, err := streams.New(name, echo(out), streams.Kafka(b.Kafka), streams.Inputs(in),
		streams.WithGuarantee(streams.ExactlyOnce), streams.InstanceID("survivor"),
		streams.Metrics(metrics.NewRegistry()), streams.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	runInBackground(t, r)
	got := streamstest.ReadN(t, b.Kafka, out, true, n, 20*time.Second, time.Second)
	took := time.Since(start)
	seen := countUins(t, got)
	if seen[1_000_000] != 0 {
		t.Fatal("the dead instance's open transaction was committed, not aborted")
	}
	assertExactlyOnce(t, seen, n)
	t.Logf("outputs readable %s after the survivor started (the dead transaction's timeout is 60 s)", took.Round(100*time.Millisecond))
}
