// Command overload offers a service (-service wallet: a real `surge
// wallet` process, grants in signed batches; -service uin-pool: a real
// `surge run uin-pool`, allocations of -batch uins per call; on the real
// broker and redis-server, default settings) load at multiples of its
// measured capacity and reports what the callers got:
// goodput, the latency of admitted requests, how fast refusals came, the
// process's RSS, and how soon after the load a request is served as
// quickly as at 1x. A last phase repeats the highest multiple while
// 10,000 idle and 250 stalled connections are held open.
// scripts/bench-overload.sh runs it into bench/overload.txt (the wallet)
// and bench/overload-pool.txt (SERVICE=uin-pool).
package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"surge/processors/wallet/auth"
)

var (
	service  = flag.String("service", "wallet", "wallet or uin-pool")
	seed     = flag.Int("seed", 3_000_000, "uin-pool: uins put in the pool before the load")
	brokers  = flag.String("brokers", "127.0.0.1:19092", "Kafka")
	redis    = flag.String("redis", "127.0.0.1:16379", "redis-server")
	phase    = flag.Duration("phase", 60*time.Second, "length of each load phase")
	factors  = flag.String("factors", "1,2,4", "offered load as multiples of the measured capacity")
	batch    = flag.Int("batch", 100, "grants per request (JSON batch), or uins per allocation")
	callers  = flag.Int("callers", 64, "concurrent callers while capacity is measured")
	idle     = flag.Int("idle", 10000, "idle keep-alive connections in the last phase")
	stalled  = flag.Int("stalled", 250, "stalled connections (4 MB announced, 64 KiB sent) in the last phase")
	fixedCap = flag.Float64("capacity", 0, "take this as the capacity (grants or uins per second) instead of measuring it: the same offered load for runs compared side by side")
	deadline = flag.String("request-timeout", "", "Request-Timeout header each caller sends (empty: none, the server's default applies)")
)

var (
	appKey  = auth.Key{ID: "bench-1", App: "bench", Secret: bytes.Repeat([]byte{9}, 32)}
	poolKey = strings.Repeat("p", 40)
	unit    = "grants" // what goodput counts
	seq     atomic.Int64
	addr    = "127.0.0.1:18581"
	client  = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4096, MaxConnsPerHost: 0}}
)

func main() {
	flag.Parse()
	dir, err := os.MkdirTemp("", "surge-overload-")
	must(err)
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "surge")
	build := exec.Command("go", "build", "-o", bin, "./cmd/surge")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stderr = os.Stderr
	must(build.Run())
	ns := fmt.Sprintf("overload%d.", time.Now().UnixNano())
	env := append(os.Environ(), "SURGE_KAFKA_BROKERS="+*brokers, "SURGE_REDIS_ADDR="+*redis, "SURGE_WALLET_NAMESPACE="+ns,
		"SURGE_WALLET_REQUIRE_KEYS=true", "SURGE_PROCESSOR_INSTANCE_ID=overload-1",
		"SURGE_WALLET_KEY_SEED="+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)),
		"SURGE_WALLET_APP_KEYS=bench:bench-1:"+base64.RawURLEncoding.EncodeToString(appKey.Secret),
		"SURGE_WALLET_USER_KEYS=u-1:"+base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32)),
		"SURGE_METRICS_ADDR="+metricsAddr, "SURGE_WALLET_DIR="+filepath.Join(dir, "ledger"), "SURGE_LOG_LEVEL=warn")
	topics := exec.Command(bin, "topics", "--create")
	topics.Env = env
	if out, err := topics.CombinedOutput(); err != nil {
		log.Fatalf("topics: %v\n%s", err, out)
	}
	svc := exec.Command(bin, "wallet", "--wallet.http_addr", addr)
	if *service == "uin-pool" {
		unit = "uins"
		env = append(env, "SURGE_UIN_NAMESPACE="+ns, "SURGE_UIN_POOL_KEYS=bench:"+poolKey)
		began := time.Now()
		gaps := exec.Command(bin, "uin", "gaps", "--ranges", fmt.Sprintf("1-%d", *seed+1))
		gaps.Env = env
		out, err := gaps.CombinedOutput()
		if err != nil {
			log.Fatalf("uin gaps: %v\n%s", err, out)
		}
		fmt.Printf("pool seeded with %d uins in %s (surge uin gaps)\n", *seed, time.Since(began).Round(time.Second))
		svc = exec.Command(bin, "run", "uin-pool", "--uin.pool_addr", addr)
	}
	svc.Env = env
	svc.Stderr = os.Stderr
	must(svc.Start())
	defer func() { _ = svc.Process.Kill(); _ = svc.Wait() }()
	pid := svc.Process.Pid
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		if code, _ := send(""); code == 200 {
			break
		}
		if time.Since(start) > 2*time.Minute {
			log.Fatalf("the %s did not answer within 2 minutes", *service)
		}
	}
	fmt.Printf("%s process (pid %d), %s\n", *service, pid, describeSettings())

	capacity := *fixedCap
	if capacity <= 0 {
		capacity = measureCapacity(15 * time.Second)
	}
	base := rss(pid)
	how := fmt.Sprintf("%d callers back to back, batches of %d, 15 s", *callers, *batch)
	if *fixedCap > 0 {
		how = "given by -capacity, not measured"
	}
	fmt.Printf("capacity: %.0f %s/s (%s); RSS %d MB\n\n", capacity, unit, how, base>>20)
	fmt.Printf("%-26s %9s %9s %7s %9s %9s %9s %9s %9s %9s %8s %8s %9s\n", "offered", unit+"/s", "goodput", "of cap", "p50 ms", "p99 ms", "svc p99", "refused", "ref p99", "svc ref", "timeouts", "RSS MB", "back in")
	var p50at1 time.Duration
	fs := strings.Split(*factors, ",")
	for i, f := range append(fs, fs[len(fs)-1]+"+conns") {
		hostile := strings.HasSuffix(f, "+conns")
		x, _ := strconv.ParseFloat(strings.TrimSuffix(f, "+conns"), 64)
		var release func()
		if hostile {
			release = holdConnections(*idle, *stalled)
		}
		r := offer(x*capacity, *phase, pid)
		if i == 0 {
			p50at1 = r.p50
		}
		back := recovery(max(2*p50at1, 20*time.Millisecond))
		if release != nil {
			release()
		}
		label := fmt.Sprintf("%sx (%.0f/s)", strings.TrimSuffix(f, "+conns"), x*capacity)
		if hostile {
			label = fmt.Sprintf("%sx +%dk idle +%d stalled", strings.TrimSuffix(f, "+conns"), *idle/1000, *stalled)
		}
		fmt.Printf("%-26s %9.0f %9.0f %6.0f%% %9.1f %9.1f %9.1f %9d %9.1f %9.1f %8d %8d %9s\n", label, r.offered, r.goodput, 100*r.goodput/capacity,
			ms(r.p50), ms(r.p99), ms(r.svcP99), r.refused, ms(r.refusedP99), ms(r.svcRefusedP99), r.timeouts, r.maxRSS>>20, back.Round(10*time.Millisecond))
	}
	fmt.Printf("\nRSS at 1x capacity: %d MB before the phases\n", base>>20)
}

func describeSettings() string {
	target := "25 ms"
	if *service == "uin-pool" {
		target = "25 ms (refill waits excused)"
	}
	return "default http.* settings (max_in_flight 64/CPU, max_queue 4x, target_latency " + target + ", max_wait 5 ms, request_timeout 2 s)" +
		map[bool]string{true: "", false: "; callers send Request-Timeout: " + *deadline}[*deadline == ""]
}

// send makes one call and returns its status and what it got answered 200
// (grants, or uins).
func send(timeout string) (int, int) {
	if *service == "uin-pool" {
		return allocate(timeout)
	}
	n := seq.Add(1)
	var b strings.Builder
	b.WriteString(`{"grants":[`)
	for i := 0; i < *batch; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"orderNo":"o%d-%d_rain_r1_1_1","actId":"o%d-%d","activityId":"spring","sceneId":"rain","rainId":"r1","awardType":"CASH","stage":1,"amount":1}`, n, i, n, i)
	}
	b.WriteString(`]}`)
	body := []byte(b.String())
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/grants/batch", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if timeout != "" {
		req.Header.Set("Request-Timeout", timeout)
	}
	auth.Sign(req, body, appKey, time.Now())
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return resp.StatusCode, 0
	}
	return 200, bytes.Count(out, []byte(`"code":200`))
}

// allocate asks the uin pool for -batch uins.
func allocate(timeout string) (int, int) {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/uins?count="+strconv.Itoa(*batch), nil)
	req.Header.Set("Authorization", "Bearer "+poolKey)
	if timeout != "" {
		req.Header.Set("Request-Timeout", timeout)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	var out struct{ Uins []uint32 }
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&out) != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, 0
	}
	return 200, len(out.Uins)
}

func measureCapacity(d time.Duration) float64 {
	var granted atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range *callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				_, n := send(*deadline)
				granted.Add(int64(n))
			}
		}()
	}
	wg.Wait()
	return float64(granted.Load()) / d.Seconds()
}

type result struct {
	offered, goodput     float64
	p50, p99, refusedP99 time.Duration
	// the service's own view (its request histogram): from arrival to
	// answer, without the client's wait for a core
	svcP99, svcRefusedP99 time.Duration
	refused, timeouts     int
	maxRSS                int64
}

// offer sends requests open-loop at rate grants/s for d: each on its own
// goroutine at its scheduled time, whatever the earlier ones got.
func offer(rate float64, d time.Duration, pid int) result {
	interval := time.Duration(float64(time.Second) * float64(*batch) / rate)
	var mu sync.Mutex
	var admitted, refusedLat []time.Duration
	var granted int64
	var refused, timeouts int
	var maxRSS atomic.Int64
	done := make(chan struct{})
	go func() {
		for {
			if r := rss(pid); r > maxRSS.Load() {
				maxRSS.Store(r)
			}
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	before := scrapeServed(apiLabel())
	start := time.Now()
	sent := 0
	for next := start; next.Before(start.Add(d)); next = next.Add(interval) {
		time.Sleep(time.Until(next))
		sent++
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			code, n := send(*deadline)
			lat := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			switch code {
			case 200:
				admitted = append(admitted, lat)
				granted += int64(n)
			case 0:
				timeouts++
			default:
				refused++
				refusedLat = append(refusedLat, lat)
			}
		}()
	}
	wg.Wait()
	close(done)
	after := scrapeServed(apiLabel())
	return result{svcP99: after.p99(before, false), svcRefusedP99: after.p99(before, true), offered: float64(sent**batch) / d.Seconds(), goodput: float64(granted) / d.Seconds(),
		p50: pct(admitted, 50), p99: pct(admitted, 99), refusedP99: pct(refusedLat, 99),
		refused: refused, timeouts: timeouts, maxRSS: maxRSS.Load()}
}

// recovery is how long after the load a lone request is answered within
// target, asked every 10 ms.
func recovery(target time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < time.Minute {
		t0 := time.Now()
		if code, _ := send(""); code == 200 && time.Since(t0) <= target {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Minute
}

// holdConnections opens idle keep-alive connections and stalled requests
// (a signed batch announcing 4 MB that sends 64 KiB and stops), until
// released.
func holdConnections(idle, stalled int) func() {
	var conns []net.Conn
	for range idle {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for range stalled {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		if *service == "uin-pool" {
			fmt.Fprintf(c, "POST /v1/uins?count=1 HTTP/1.1\r\nHost: p\r\nContent-Length: 4000000\r\nAuthorization: Bearer %s\r\n\r\n", poolKey)
		} else {
			req, _ := http.NewRequest("POST", "http://"+addr+"/v1/grants/batch", nil)
			auth.Sign(req, []byte("x"), appKey, time.Now())
			fmt.Fprintf(c, "POST /v1/grants/batch HTTP/1.1\r\nHost: w\r\nContent-Length: 4000000\r\nX-Surge-Key: %s\r\nX-Surge-Timestamp: %s\r\nX-Surge-Signature: %s\r\n\r\n",
				req.Header.Get(auth.HeaderKey), req.Header.Get(auth.HeaderTimestamp), req.Header.Get(auth.HeaderSignature))
		}
		_, _ = c.Write(make([]byte, 64<<10))
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// rss is the process's resident set in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
