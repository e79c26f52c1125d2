// Package progress draws a one-line progress bar on stderr, for long
// work run from a terminal (the demo, the load generator, replays).
package progress

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Bar is one bar: its label, its total and when it started.
type Bar struct {
	label string
	total int64
	start time.Time
}

// New starts a bar for total units of work.
func New(label string, total int64) *Bar {
	return &Bar{label: label, total: total, start: time.Now()}
}

// Set redraws the bar at n units done, with the rate so far.
func (p *Bar) Set(n int64) {
	const width = 30
	frac := float64(n) / float64(max(p.total, 1))
	filled := min(max(int(frac*width), 0), width)
	rate := float64(n) / max(time.Since(p.start).Seconds(), 1e-9)
	fmt.Fprintf(os.Stderr, "\r[%s%s] %5.1f%% %d/%d %s  %.0f/s ", strings.Repeat("#", filled),
		strings.Repeat(".", width-filled), 100*frac, n, p.total, p.label, rate)
}

// Done ends the bar's line.
func (p *Bar) Done() { fmt.Fprintln(os.Stderr) }
