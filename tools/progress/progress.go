// Package progress draws a one-line progress bar on stderr, for long
// work run from a terminal (the demo, the load generator, replays). When
// stderr is not a terminal (a log file, a pipe, a container's log), it
// writes a plain line every few seconds instead of redrawing one line
// with carriage returns.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// logEvery is how often a bar writes a line when stderr is not a terminal.
const logEvery = 5 * time.Second

// Bar is one bar: its label, its total and when it started.
type Bar struct {
	label  string
	total  int64
	start  time.Time
	out    io.Writer
	tty    bool
	logged time.Time // the last line written, off a terminal
	last   int64
}

// New starts a bar for total units of work.
func New(label string, total int64) *Bar {
	return newTo(os.Stderr, isTerminal(os.Stderr), label, total)
}

func newTo(out io.Writer, tty bool, label string, total int64) *Bar {
	now := time.Now()
	return &Bar{label: label, total: total, start: now, out: out, tty: tty, logged: now}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Set redraws the bar at n units done, with the rate so far.
func (p *Bar) Set(n int64) {
	p.last = n
	if !p.tty {
		if time.Since(p.logged) < logEvery {
			return
		}
		p.logged = time.Now()
		fmt.Fprintln(p.out, p.line(n))
		return
	}
	const width = 30
	frac := float64(n) / float64(max(p.total, 1))
	filled := min(max(int(frac*width), 0), width)
	fmt.Fprintf(p.out, "\r[%s%s] %s ", strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.line(n))
}

// line is the bar's figures: done, total, and the rate once it means
// something (not over the first tenth of a second).
func (p *Bar) line(n int64) string {
	s := fmt.Sprintf("%5.1f%% %d/%d %s", 100*float64(n)/float64(max(p.total, 1)), n, p.total, p.label)
	if el := time.Since(p.start); el >= 100*time.Millisecond {
		s += fmt.Sprintf("  %.0f/s", float64(n)/el.Seconds())
	}
	return s
}

// Done ends the bar's line (off a terminal: writes the last figures).
func (p *Bar) Done() {
	if !p.tty {
		fmt.Fprintln(p.out, p.line(p.last), "(done)")
		return
	}
	fmt.Fprintln(p.out)
}
