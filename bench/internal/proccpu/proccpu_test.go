package proccpu

import (
	"os"
	"testing"
	"time"
)

func TestOfSelfGrowsWithWork(t *testing.T) {
	before, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	after, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 100*time.Millisecond {
		t.Fatalf("300ms of busy work counted as %v (%d loops)", after-before, x)
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
