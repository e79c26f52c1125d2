// Package metrics is a small Prometheus-text metrics registry: counters and
// gauges with fixed label names, exposed on an HTTP handler. It exists so the
// runtime has no heavier dependency than it needs; the exposition format is
// Prometheus text format 0.0.4.
package metrics

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Registry holds metric families by name.
type Registry struct {
	mu       sync.Mutex
	families map[string]*family
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{families: map[string]*family{}} }

// Default is the process-wide registry used when none is given.
var Default = NewRegistry()

type kind string

const (
	counterKind kind = "counter"
	gaugeKind   kind = "gauge"
)

type family struct {
	name, help string
	kind       kind
	labels     []string
	mu         sync.Mutex
	series     map[string]*series
}

type series struct {
	labelValues []string
	bits        atomic.Uint64 // float64 bits
}

func (s *series) add(d float64) {
	for {
		old := s.bits.Load()
		if s.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

func (s *series) set(v float64) { s.bits.Store(math.Float64bits(v)) }
func (s *series) get() float64  { return math.Float64frombits(s.bits.Load()) }

func (r *Registry) family(name, help string, k kind, labels []string) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.families[name]; ok {
		if f.kind != k || len(f.labels) != len(labels) {
			panic(fmt.Sprintf("metrics: %s re-registered with another kind or labels", name))
		}
		return f
	}
	f := &family{name: name, help: help, kind: k, labels: labels, series: map[string]*series{}}
	r.families[name] = f
	return f
}

func (f *family) with(values []string) *series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s wants %d label values, got %d", f.name, len(f.labels), len(values)))
	}
	key := strings.Join(values, "\xff")
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.series[key]
	if !ok {
		s = &series{labelValues: append([]string(nil), values...)}
		f.series[key] = s
	}
	return s
}

// CounterVec is a family of monotonically increasing counters.
type CounterVec struct{ f *family }

// Counter is one series of a CounterVec.
type Counter struct{ s *series }

// NewCounterVec registers (or returns the existing) counter family.
func (r *Registry) NewCounterVec(name, help string, labels ...string) CounterVec {
	return CounterVec{r.family(name, help, counterKind, labels)}
}

// With returns the series for these label values.
func (c CounterVec) With(values ...string) Counter { return Counter{c.f.with(values)} }

// Add adds d (which must not be negative).
func (c Counter) Add(d float64) {
	if d < 0 {
		panic("metrics: counter decreased")
	}
	c.s.add(d)
}

// Inc adds one.
func (c Counter) Inc() { c.s.add(1) }

// Value reads the current value.
func (c Counter) Value() float64 { return c.s.get() }

// GaugeVec is a family of gauges.
type GaugeVec struct{ f *family }

// Gauge is one series of a GaugeVec.
type Gauge struct{ s *series }

// NewGaugeVec registers (or returns the existing) gauge family.
func (r *Registry) NewGaugeVec(name, help string, labels ...string) GaugeVec {
	return GaugeVec{r.family(name, help, gaugeKind, labels)}
}

// With returns the series for these label values.
func (g GaugeVec) With(values ...string) Gauge { return Gauge{g.f.with(values)} }

// Set sets the gauge.
func (g Gauge) Set(v float64) { g.s.set(v) }

// Add adds d (may be negative).
func (g Gauge) Add(d float64) { g.s.add(d) }

// Value reads the current value.
func (g Gauge) Value() float64 { return g.s.get() }

// WriteText writes every family in Prometheus text format, sorted by name.
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	fams := make([]*family, 0, len(r.families))
	for _, f := range r.families {
		fams = append(fams, f)
	}
	r.mu.Unlock()
	sort.Slice(fams, func(i, j int) bool { return fams[i].name < fams[j].name })
	var b strings.Builder
	for _, f := range fams {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.kind)
		f.mu.Lock()
		keys := make([]string, 0, len(f.series))
		for k := range f.series {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s := f.series[k]
			b.WriteString(f.name)
			if len(f.labels) > 0 {
				b.WriteByte('{')
				for i, l := range f.labels {
					if i > 0 {
						b.WriteByte(',')
					}
					fmt.Fprintf(&b, "%s=%q", l, s.labelValues[i])
				}
				b.WriteByte('}')
			}
			fmt.Fprintf(&b, " %s\n", formatFloat(s.get()))
		}
		f.mu.Unlock()
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatFloat(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%g", v)
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

// Handler serves the registry at any path.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_ = r.WriteText(w)
	})
}
