// Package metrics is surge's view of Prometheus metrics, over the
// ecosystem's client (github.com/prometheus/client_golang): counters,
// gauges and histograms with fixed label names, registered once by name
// (registering a name again returns the same family), and exposed with the
// Go runtime and process collectors on an HTTP handler.
//
// Names follow Prometheus conventions: surge_ prefix, base units
// (_seconds, _bytes), counters ending in _total.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Registry holds metric families by name.
type Registry struct {
	reg    *prometheus.Registry
	mu     sync.Mutex
	byName map[string]prometheus.Collector
}

// NewRegistry returns a registry with the Go runtime and process
// collectors.
func NewRegistry() *Registry {
	r := &Registry{reg: prometheus.NewRegistry(), byName: map[string]prometheus.Collector{}}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Default is the process-wide registry used when none is given.
var Default = NewRegistry()

// register registers c as name, or returns the collector already
// registered under name (whatever its help; it must be of the same kind).
func register[C prometheus.Collector](r *Registry, name string, c C) C {
	r.mu.Lock()
	defer r.mu.Unlock()
	if existing, ok := r.byName[name]; ok {
		if e, ok := existing.(C); ok {
			return e
		}
		panic(fmt.Sprintf("metrics: %s registered again as another kind", name)) // a programming error
	}
	if err := r.reg.Register(c); err != nil {
		panic(fmt.Sprintf("metrics: %s: %v", name, err))
	}
	r.byName[name] = c
	return c
}

// CounterVec is a family of monotonically increasing counters.
type CounterVec struct{ v *prometheus.CounterVec }

// Counter is one series of a CounterVec.
type Counter struct{ c prometheus.Counter }

// NewCounterVec registers (or returns the existing) counter family.
func (r *Registry) NewCounterVec(name, help string, labels ...string) CounterVec {
	return CounterVec{register(r, name, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))}
}

// With returns the series for the label values (in the family's order).
func (c CounterVec) With(values ...string) Counter { return Counter{c.v.WithLabelValues(values...)} }

// Add adds d, which must not be negative (client_golang panics).
func (c Counter) Add(d float64) { c.c.Add(d) }

// Inc adds one.
func (c Counter) Inc() { c.c.Inc() }

// Value reads the counter (tests, progress reports).
func (c Counter) Value() float64 {
	var m dto.Metric
	_ = c.c.Write(&m)
	return m.GetCounter().GetValue()
}

// GaugeVec is a family of gauges.
type GaugeVec struct{ v *prometheus.GaugeVec }

// Gauge is one series of a GaugeVec.
type Gauge struct{ g prometheus.Gauge }

// NewGaugeVec registers (or returns the existing) gauge family.
func (r *Registry) NewGaugeVec(name, help string, labels ...string) GaugeVec {
	return GaugeVec{register(r, name, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))}
}

// With returns the series for the label values.
func (g GaugeVec) With(values ...string) Gauge { return Gauge{g.v.WithLabelValues(values...)} }

// Set sets the gauge.
func (g Gauge) Set(v float64) { g.g.Set(v) }

// Add adds d (which may be negative).
func (g Gauge) Add(d float64) { g.g.Add(d) }

// Value reads the gauge.
func (g Gauge) Value() float64 {
	var m dto.Metric
	_ = g.g.Write(&m)
	return m.GetGauge().GetValue()
}

// HistogramVec is a family of histograms.
type HistogramVec struct{ v *prometheus.HistogramVec }

// Histogram is one series of a HistogramVec.
type Histogram struct{ h prometheus.Observer }

// LatencyBuckets are for durations in seconds, from 100 µs to 10 s.
var LatencyBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 11)

// NewHistogramVec registers (or returns the existing) histogram family
// with the given buckets (upper bounds).
func (r *Registry) NewHistogramVec(name, help string, buckets []float64, labels ...string) HistogramVec {
	return HistogramVec{register(r, name, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))}
}

// With returns the series for the label values.
func (h HistogramVec) With(values ...string) Histogram {
	return Histogram{h.v.WithLabelValues(values...)}
}

// Observe records one value.
func (h Histogram) Observe(v float64) { h.h.Observe(v) }

// Since records the seconds since start.
func (h Histogram) Since(start time.Time) { h.h.Observe(time.Since(start).Seconds()) }

// Count is how many values were observed (tests).
func (h Histogram) Count() uint64 {
	var m dto.Metric
	if w, ok := h.h.(prometheus.Metric); ok {
		_ = w.Write(&m)
	}
	return m.GetHistogram().GetSampleCount()
}

// WriteText writes every family in the Prometheus text format (labels in
// name order), as a scrape would.
func (r *Registry) WriteText(w io.Writer) error {
	families, err := r.reg.Gather()
	if err != nil {
		return err
	}
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(w, f); err != nil {
			return err
		}
	}
	return nil
}

// Handler serves the registry in the Prometheus exposition format.
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

// InstrumentHTTP records every request h serves in
// surge_http_request_duration_seconds{api, method, code}.
func (r *Registry) InstrumentHTTP(api string, h http.Handler) http.Handler {
	d := r.NewHistogramVec("surge_http_request_duration_seconds", "HTTP requests served, by API, method and status code",
		LatencyBuckets, "api", "method", "code")
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, req)
		d.With(api, req.Method, strconv.Itoa(sw.code)).Since(start)
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes through, for streaming responses.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
