package metrics

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestCountersAndGaugesExposeInPrometheusText(t *testing.T) {
	r := NewRegistry()
	in := r.NewCounterVec("surge_records_in_total", "records consumed", "processor")
	lag := r.NewGaugeVec("surge_lag", "lag", "processor", "partition")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				in.With("echo").Inc()
			}
		}()
	}
	wg.Wait()
	lag.With("echo", "3").Set(42)
	lag.With("echo", "3").Add(-2)

	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		"# TYPE surge_records_in_total counter",
		`surge_records_in_total{processor="echo"} 8000`,
		"# TYPE surge_lag gauge",
		`surge_lag{processor="echo",partition="3"} 40`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("missing %q in\n%s", want, body)
		}
	}
}

func TestCounterRefusesToDecrease(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("negative add accepted")
		}
	}()
	NewRegistry().NewCounterVec("c", "c").With().Add(-1)
}
