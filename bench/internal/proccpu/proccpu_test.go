package proccpu

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// Of must agree with the kernel's own account of this process (getrusage),
// whatever share of the CPU the test gets on a busy machine.
func TestOfAgreesWithRusage(t *testing.T) {
	rusage := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r0 := rusage()
	deadline := time.Now().Add(30 * time.Second)
	for rusage()-r0 < 300*time.Millisecond && time.Now().Before(deadline) {
	}
	after, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	got, want := after-before, rusage()-r0
	// /proc counts in ticks of 10ms, sampled at slightly other moments.
	if d := got - want; d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Fatalf("Of counted %v of CPU, getrusage %v", got, want)
	}
}

func TestParse(t *testing.T) {
	ws, err := Parse("broker=12, redis=34")
	if err != nil || len(ws) != 2 || ws[0] != (Watched{"broker", 12}) || ws[1] != (Watched{"redis", 34}) {
		t.Fatalf("Parse = %v, %v", ws, err)
	}
	if ws, err := Parse(""); err != nil || len(ws) != 0 {
		t.Fatalf("empty: %v, %v", ws, err)
	}
	for _, bad := range []string{"broker", "broker=", "=12", "broker=x", "broker=-1"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestOfMissingProcess(t *testing.T) {
	if _, err := Of(1 << 30); err == nil {
		t.Fatal("no error for a pid that cannot exist")
	}
}
