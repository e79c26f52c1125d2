package progress

import (
	"strings"
	"testing"
	"time"
)

// Off a terminal a bar writes whole lines, no carriage returns, at most
// one per logEvery and a last one at Done; a rate is shown only once it
// means something (the first tick used to show 5042864347/s).
func TestBarOffATerminalWritesLines(t *testing.T) {
	var out strings.Builder
	b := newTo(&out, false, "records read", 1000)
	for i := range 1000 {
		b.Set(int64(i + 1))
	}
	b.logged = time.Now().Add(-2 * logEvery) // the next Set is due a line
	b.Set(1000)
	b.Done()
	s := out.String()
	if strings.Contains(s, "\r") {
		t.Fatalf("carriage returns off a terminal: %q", s)
	}
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "1000/1000 records read") || !strings.HasSuffix(lines[1], "(done)") {
		t.Fatalf("lines %q, want one line when due and one at Done", lines)
	}
	var term strings.Builder
	tb := newTo(&term, true, "x", 10)
	tb.Set(1)
	if !strings.HasPrefix(term.String(), "\r[") || strings.Contains(term.String(), "/s") {
		t.Fatalf("on a terminal, first tick: %q (a redrawn line, no rate yet)", term.String())
	}
}
