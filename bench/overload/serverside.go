package main

import (
	"math"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// metricsAddr is where the service under test serves /metrics
// (SURGE_METRICS_ADDR in its environment).
const metricsAddr = "127.0.0.1:19581"

// served is the service's own request histogram (surge_http_request_
// duration_seconds), summed over methods, by outcome: what the service
// itself took, from the request's arrival to its answer, without the
// client's share of a machine the load generator saturates as well.
type served struct {
	upper             []float64 // finite bucket bounds, seconds
	admitted, refused []uint64  // cumulative counts per bound, then the total
}

func scrapeServed(api string) served {
	var s served
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	var p expfmt.TextParser
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return s
	}
	f := families["surge_http_request_duration_seconds"]
	if f == nil {
		return s
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["api"] != api {
			continue
		}
		var into *[]uint64
		switch code := labels["code"]; {
		case code == "200":
			into = &s.admitted
		case code == "503" || code == "429":
			into = &s.refused
		default:
			continue
		}
		add(&s, into, m.GetHistogram())
	}
	return s
}

func add(s *served, into *[]uint64, h *dto.Histogram) {
	var buckets []*dto.Bucket
	for _, b := range h.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) {
			buckets = append(buckets, b)
		}
	}
	if s.upper == nil {
		for _, b := range buckets {
			s.upper = append(s.upper, b.GetUpperBound())
		}
		s.admitted, s.refused = make([]uint64, len(buckets)+1), make([]uint64, len(buckets)+1)
	}
	for i, b := range buckets {
		if i < len(s.upper) {
			(*into)[i] += b.GetCumulativeCount()
		}
	}
	(*into)[len(s.upper)] += h.GetSampleCount()
}

// p99 of what was answered between before and s (linear within a
// bucket; above the last bound it says the last bound).
func (s served) p99(before served, refused bool) time.Duration {
	now, then := s.admitted, before.admitted
	if refused {
		now, then = s.refused, before.refused
	}
	if len(now) == 0 {
		return 0
	}
	count := func(i int) float64 {
		if i < len(then) {
			return float64(now[i] - then[i])
		}
		return float64(now[i])
	}
	total := count(len(now) - 1)
	if total == 0 {
		return 0
	}
	want, lower, below := 0.99*total, 0.0, 0.0
	for i, upper := range s.upper { // the total, last, is past every bound
		c := count(i)
		if c >= want {
			frac := (want - below) / max(c-below, 1)
			return time.Duration((lower + frac*(upper-lower)) * float64(time.Second))
		}
		lower, below = upper, c
	}
	return time.Duration(s.upper[len(s.upper)-1] * float64(time.Second))
}

// apiLabel is the api label of the service's requests.
func apiLabel() string { return strings.TrimSpace(*service) }
