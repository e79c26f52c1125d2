// Package proccpu reads how much CPU other processes on this machine have
// used, so a benchmark can say where a two-core machine's time went: its
// own process, the broker's JVM, redis-server, a service it drives.
package proccpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const userHZ = 100

// Of returns the user+system CPU time process pid has used so far.
func Of(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count fields after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("proccpu: short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("proccpu: bad /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// Watched is a named process whose CPU a benchmark reports.
type Watched struct {
	Name string
	PID  int
}

// Parse reads "name=pid,name=pid" (empty: none).
func Parse(s string) ([]Watched, error) {
	var ws []Watched
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, pid, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || name == "" || n <= 0 {
			return nil, fmt.Errorf("proccpu: %q is not name=pid", part)
		}
		ws = append(ws, Watched{Name: name, PID: n})
	}
	return ws, nil
}

// Span measures the CPU of watched processes over a stretch of time.
type Span struct {
	ws    []Watched
	start time.Time
	cpu0  []time.Duration
}

// Start begins a span over ws.
func Start(ws []Watched) *Span {
	s := &Span{ws: ws, start: time.Now(), cpu0: make([]time.Duration, len(ws))}
	for i, w := range ws {
		s.cpu0[i], _ = Of(w.PID)
	}
	return s
}

// used is each watched process's CPU time since Start, and the wall time.
func (s *Span) used() ([]time.Duration, time.Duration) {
	used := make([]time.Duration, len(s.ws))
	for i, w := range s.ws {
		c, err := Of(w.PID)
		if err == nil {
			used[i] = c - s.cpu0[i]
		}
	}
	return used, time.Since(s.start)
}

// Report says, for n units of work done in the span, how many cores each
// watched process used and its CPU per unit: "broker 0.52 cores 2.9µs/grant,
// redis 0.31 cores 1.7µs/grant". Empty when nothing is watched.
func (s *Span) Report(n int, unit string) string {
	if len(s.ws) == 0 {
		return ""
	}
	used, wall := s.used()
	var parts []string
	for i, w := range s.ws {
		parts = append(parts, fmt.Sprintf("%s %.2f cores %.2fµs/%s", w.Name, used[i].Seconds()/wall.Seconds(),
			float64(used[i].Microseconds())/float64(n), unit))
	}
	return strings.Join(parts, ", ")
}
