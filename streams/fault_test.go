package streams_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"surge/streams"
	"surge/streams/streamstest"
)

// TestCrashAtEveryStepOfACommit: an exactly-once processor kills itself
// (SIGKILL) at one step of a batch's commit — before its outputs are
// produced, once they are acknowledged, right before the transaction ends,
// and while the end is in flight — three times, and is restarted each
// time. Every input is in the output exactly once. A runtime that
// committed its offsets before producing, or produced outside the
// transaction, fails here at the step where that loses or repeats records.
func TestCrashAtEveryStepOfACommit(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		for _, p := range []streams.FaultPoint{streams.FaultBeforeProduce, streams.FaultAfterProduce, streams.FaultBeforeCommit, streams.FaultDuringCommit} {
			t.Run(p.String(), func(t *testing.T) {
				t.Parallel()
				faultTest(t, b, p)
			})
		}
	})
}

func faultTest(t *testing.T, b streamstest.Backend, p streams.FaultPoint) {
	in, out := streamstest.Unique("fault-in"), streamstest.Unique("fault-out")
	streamstest.CreateTopics(t, b.Kafka, 3, in, out)
	const n = 6000
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = loginRecord(t, in, uint64(i))
	}
	streamstest.ProduceSync(t, streamstest.Client(t, b.Kafka), recs...)
	name := streamstest.Unique("fault")
	start := func(fault string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFaultChild$")
		cmd.Env = append(os.Environ(), "SURGE_FAULT_CHILD=1", "SURGE_CHILD_BROKERS="+strings.Join(b.Kafka.Seeds, ","),
			"SURGE_CHILD_IN="+in, "SURGE_CHILD_OUT="+out, "SURGE_CHILD_NAME="+name, "SURGE_FAULT="+fault)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	for i := range 3 {
		cmd := start(p.String())
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("run %d did not die at %s: %v", i+1, p, err)
			}
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("run %d never reached %s", i+1, p)
		}
		got := len(streamstest.ReadN(t, b.Kafka, out, true, n, time.Second, 0))
		if got >= n {
			t.Fatalf("kill %d at %s came after the work was finished; the test proves nothing", i+1, p)
		}
		t.Logf("killed at %s: %d of %d outputs committed", p, got, n)
	}
	final := start("")
	defer func() { _ = final.Process.Kill(); _ = final.Wait() }()
	assertExactlyOnce(t, countUins(t, streamstest.ReadN(t, b.Kafka, out, true, n, 120*time.Second, 3*time.Second)), n)
}

// TestFaultChild is the processor of TestCrashAtEveryStepOfACommit: it
// kills itself at SURGE_FAULT in its third batch.
func TestFaultChild(t *testing.T) {
	if os.Getenv("SURGE_FAULT_CHILD") != "1" {
		t.Skip("helper process for TestCrashAtEveryStepOfACommit")
	}
	fault := os.Getenv("SURGE_FAULT")
	var batches atomic.Int32
	hook := func(p streams.FaultPoint) {
		if p.String() != fault || batches.Add(1) != 3 {
			return
		}
		if p == streams.FaultDuringCommit {
			// Land while the commit's requests are on the wire.
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns: the step after it must not run
	}
	r, err := streams.New(os.Getenv("SURGE_CHILD_NAME"), echo(os.Getenv("SURGE_CHILD_OUT")),
		streams.Kafka(streams.Seeds(strings.Split(os.Getenv("SURGE_CHILD_BROKERS"), ",")...)),
		streams.Inputs(os.Getenv("SURGE_CHILD_IN")), streams.WithGuarantee(streams.ExactlyOnce),
		streams.InstanceID("only"), streams.StaticMembership(), streams.MaxBatch(500), streams.Faults(hook),
		streams.TransactionTimeout(10*time.Second), streams.Logger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Run(context.Background()) // runs until killed
}
