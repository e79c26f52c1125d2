package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func scrape(t *testing.T, r *Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d", rec.Code)
	}
	return rec.Body.String()
}

func TestCountersGaugesHistogramsAndRuntimeExposed(t *testing.T) {
	r := NewRegistry()
	in := r.NewCounterVec("surge_records_in_total", "records consumed", "processor")
	lag := r.NewGaugeVec("surge_lag", "lag", "processor", "partition")
	batch := r.NewHistogramVec("surge_batch_duration_seconds", "batch time", LatencyBuckets, "processor")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				in.With("echo").Inc()
			}
		}()
	}
	wg.Wait()
	lag.With("echo", "3").Set(42)
	lag.With("echo", "3").Add(-2)
	batch.With("echo").Observe(0.003)
	batch.With("echo").Observe(2)
	if v := in.With("echo").Value(); v != 8000 {
		t.Fatalf("counter %v, want 8000", v)
	}
	if n := batch.With("echo").Count(); n != 2 {
		t.Fatalf("histogram count %d, want 2", n)
	}
	body := scrape(t, r)
	for _, want := range []string{
		"# TYPE surge_records_in_total counter",
		`surge_records_in_total{processor="echo"} 8000`,
		"# TYPE surge_lag gauge",
		`surge_lag{partition="3",processor="echo"} 40`,
		"# TYPE surge_batch_duration_seconds histogram",
		`surge_batch_duration_seconds_bucket{processor="echo",le="0.00390625"} 1`,
		`surge_batch_duration_seconds_count{processor="echo"} 2`,
		"go_goroutines ",
		"process_cpu_seconds_total ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %q in\n%s", want, body)
		}
	}
}

// Registering a name again returns the same family, so components that
// share a registry count into one series.
func TestRegisteringTwiceSharesTheFamily(t *testing.T) {
	r := NewRegistry()
	r.NewCounterVec("surge_x_total", "x", "k").With("a").Add(2)
	r.NewCounterVec("surge_x_total", "x", "k").With("a").Add(3)
	if v := r.NewCounterVec("surge_x_total", "x", "k").With("a").Value(); v != 5 {
		t.Fatalf("shared counter %v, want 5", v)
	}
}

func TestCounterRefusesToDecrease(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("negative add accepted")
		}
	}()
	NewRegistry().NewCounterVec("c_total", "c").With().Add(-1)
}

func TestInstrumentHTTPRecordsStatusAndDuration(t *testing.T) {
	r := NewRegistry()
	h := r.InstrumentHTTP("demo", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/bad" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		time.Sleep(time.Millisecond)
		_, _ = w.Write([]byte("ok"))
	}))
	for _, p := range []string{"/ok", "/ok", "/bad"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", p, nil))
	}
	body := scrape(t, r)
	for _, want := range []string{
		`surge_http_request_duration_seconds_count{api="demo",code="200",method="GET"} 2`,
		`surge_http_request_duration_seconds_count{api="demo",code="401",method="GET"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %q in\n%s", want, body)
		}
	}
}
