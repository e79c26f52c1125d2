package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"surge/processors/wallet/auth"
	"surge/schemas"
	"surge/streams"
	"surge/streams/streamstest"
)

// composeService is a surge service of docker-compose.yml, anchors and
// merge keys resolved.
type composeService struct {
	Image   string            `yaml:"image"`
	Command []string          `yaml:"command"`
	Env     map[string]string `yaml:"environment"`
	Profile []string          `yaml:"profiles"`
}

// TestComposeServicesStartAsTheImageUser runs every long-running surge
// service of docker-compose.yml with its own command and environment, as
// the image's user (uid 65534, when the test runs as root) and with the
// image's binary (a plain build, no chDB), against the real broker and
// redis-server: the compose host names are mapped to them, the secrets
// the compose file requires are given as a deployer would, and each
// service's listen addresses are moved to free loopback ports. Each must
// become ready (/readyz, what the image's HEALTHCHECK asks). The sinks
// and recon need a ClickHouse server: with chDB on this machine,
// `surge clickhouse serve` stands in for compose's clickhouse service
// (ClickHouse's HTTP interface, the user and password the compose file
// gives), and they run too; without it they are left out.
func TestComposeServicesStartAsTheImageUser(t *testing.T) {
	b := streamstest.RealBroker(t)
	rdb, ok := streamstest.RedisClient(t)
	if !ok {
		t.Skip("no redis-server (SURGE_TEST_REDIS)")
	}
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	asImageUser := os.Geteuid() == 0
	bin := imageBinary(t, asImageUser)
	stateRoot := mkdirFor(t, asImageUser) // where the image's volume would be mounted

	ns := streamstest.Unique("compose") + "."
	secrets := map[string]string{
		"SURGE_REDIS_PASSWORD":      "", // the test's redis-server has none
		"SURGE_CLICKHOUSE_PASSWORD": "a-clickhouse-password-for-compose",
		"SURGE_WALLET_KEY_SEED":     base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32)),
		"SURGE_WALLET_APP_KEYS":     "rain:rain-1:" + base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{4}, 32)),
		"SURGE_WALLET_USER_KEYS":    "u-1:" + base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{6}, 32)),
		"SURGE_UIN_POOL_KEYS":       "registration:" + strings.Repeat("k", 32),
		"SURGE_RECON_KEYS":          "ops:" + strings.Repeat("r", 32),
	}
	clickhouseDSN, withClickhouse := composeClickhouse(t, secrets)
	hosts := strings.NewReplacer("kafka:9092", strings.Join(b.Kafka.Seeds, ","), "redis:6379", rdb.Options().Addr,
		"clickhouse://clickhouse:9000/default", clickhouseDSN)
	// Unnamespaced topics for presence (it has none); namespaced ones for
	// the rest, made by the compose file's own topics service.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := streamstest.Client(t, b.Kafka)
	if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, schemas.Topics...); err != nil {
		t.Fatal(err)
	}

	port := 21000 + int(time.Now().UnixNano()%2000)*4
	nextAddr := func() string { port++; return fmt.Sprintf("127.0.0.1:%d", port) }
	envOf := func(name string, s composeService) ([]string, map[string]string) {
		env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + stateRoot, "TMPDIR=" + stateRoot,
			"SURGE_PUSH_NAMESPACE=" + ns, "SURGE_UIN_NAMESPACE=" + ns, "SURGE_WALLET_NAMESPACE=" + ns, "SURGE_LOG_LEVEL=info"}
		moved := map[string]string{}
		for k, v := range s.Env {
			v = interpolate(t, name, k, v, secrets)
			v = hosts.Replace(v)
			if strings.HasPrefix(v, "/var/lib/surge") {
				v = filepath.Join(stateRoot, name, strings.TrimPrefix(v, "/var/lib/surge"))
			}
			if strings.HasPrefix(v, "0.0.0.0:") {
				v = nextAddr()
				moved[k] = v
			}
			env = append(env, k+"="+v)
		}
		return env, moved
	}

	// The topics service first, as compose orders it.
	topicsEnv, _ := envOf("topics", f.Services["topics"])
	if out, err := imageUserCommand(bin, asImageUser, topicsEnv, f.Services["topics"].Command...).CombinedOutput(); err != nil {
		t.Fatalf("compose topics service: %v\n%s", err, out)
	}

	type running struct {
		name, ready string
		env, args   []string
		read        func() error // a read of its API, for the services that serve one
		cmd         *exec.Cmd
		log         *syncWriter
	}
	start := func(r *running) {
		r.log = &syncWriter{b: &bytes.Buffer{}}
		r.cmd = imageUserCommand(bin, asImageUser, r.env, r.args...)
		r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
		if err := r.cmd.Start(); err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
	}
	var started []*running
	var names []string
	for name, s := range f.Services {
		if s.Image != "surge:latest" || len(s.Profile) > 0 || name == "topics" ||
			!withClickhouse && (name == "recon" || len(s.Command) > 1 && strings.HasPrefix(s.Command[1], "sink-")) {
			continue
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := f.Services[name]
		env, moved := envOf(name, s)
		args := append([]string(nil), s.Command...)
		for i, a := range args {
			if strings.HasPrefix(a, "0.0.0.0:") {
				args[i] = nextAddr()
				moved["arg"] = args[i]
			}
		}
		metricsAddr, ok := moved["SURGE_METRICS_ADDR"]
		if !ok {
			t.Fatalf("%s: no SURGE_METRICS_ADDR on 0.0.0.0 (the HEALTHCHECK probes it)", name)
		}
		r := &running{name: name, ready: metricsAddr, env: env, args: args}
		switch {
		case len(s.Command) > 1 && s.Command[1] == "wallet":
			r.read = walletRead(moved["SURGE_WALLET_HTTP_ADDR"], bytes.Repeat([]byte{6}, 32))
		case len(s.Command) > 1 && s.Command[0] == "recon" && s.Command[1] == "serve":
			r.read = reconRead(moved["SURGE_RECON_HTTP_ADDR"], strings.Repeat("r", 32))
		case len(s.Command) > 1 && s.Command[1] == "uin-pool":
			r.read = poolRead(moved["SURGE_UIN_POOL_ADDR"], strings.Repeat("k", 32))
		}
		start(r)
		started = append(started, r)
	}
	defer func() {
		for _, r := range started {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
	}()

	// Each becomes ready, as the image's HEALTHCHECK (surge probe) sees it.
	probe := func(r *running) error {
		out, err := imageUserCommand(bin, asImageUser, []string{"PATH=" + os.Getenv("PATH"), "SURGE_METRICS_ADDR=" + r.ready}, "probe").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	waitFor := func(r *running, what string, check func() error, deadline time.Time) {
		for {
			err := check()
			if err == nil {
				return
			}
			if r.cmd.ProcessState != nil || time.Now().After(deadline) {
				t.Fatalf("%s never %s: %v\n--- its log:\n%s", r.name, what, err, r.log.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	begun := time.Now()
	var took []string
	for _, r := range started {
		waitFor(r, "became ready", func() error { return probe(r) }, begun.Add(3*time.Minute))
		took = append(took, fmt.Sprintf("%s %s", r.name, time.Since(begun).Round(100*time.Millisecond)))
	}
	t.Logf("ready after: %s", strings.Join(took, ", "))
	t.Logf("%d compose services ready as uid %d: %s", len(started), map[bool]int{true: 65534, false: os.Geteuid()}[asImageUser], strings.Join(names, ", "))

	// kill -9 of each, one at a time, and a restart with the same command
	// and environment at once, as a restart policy does: each is ready
	// again (and the APIs answer reads) with the default settings. The
	// times are the restart benchmark (scripts/bench-restart.sh).
	table := []string{fmt.Sprintf("%-20s %12s %12s", "service", "ready (s)", "reads (s)")}
	for _, r := range started {
		if r.read != nil {
			waitFor(r, "answered a read", r.read, time.Now().Add(time.Minute))
		}
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
		_ = r.cmd.Wait()
		killed := time.Now()
		start(r)
		waitFor(r, "became ready after kill -9", func() error { return probe(r) }, killed.Add(2*time.Minute))
		ready := time.Since(killed)
		reads := "-"
		if r.read != nil {
			waitFor(r, "answered a read after kill -9", r.read, killed.Add(2*time.Minute))
			reads = fmt.Sprintf("%.1f", time.Since(killed).Seconds())
		}
		table = append(table, fmt.Sprintf("%-20s %12.1f %12s", r.name, ready.Seconds(), reads))
	}
	t.Logf("back after kill -9 and an immediate restart:\n%s", strings.Join(table, "\n"))
	if out := os.Getenv("SURGE_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(strings.Join(table, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// composeClickhouse starts `surge clickhouse serve` (the test binary,
// built with chDB) in place of compose's clickhouse service, with its
// user and the deployer's password: the DSN the services reach it by,
// and false when this machine has no chDB (the sinks are then left out).
func composeClickhouse(t *testing.T, secrets map[string]string) (string, bool) {
	t.Helper()
	if os.Getenv("CHDB_LIB_PATH") == "" {
		t.Log("no chDB (CHDB_LIB_PATH): the sinks and recon are left out")
		return "clickhouse://unreachable:9000/default", false
	}
	addr := freePort(t)
	srv := runCommand(t, []string{"SURGE_CLICKHOUSE_USERNAME=surge", "SURGE_CLICKHOUSE_PASSWORD=" + secrets["SURGE_CLICKHOUSE_PASSWORD"],
		"SURGE_CLICKHOUSE_CHDB_DIR=" + t.TempDir(), "SURGE_CLICKHOUSE_SERVE_ADDR=" + addr, "SURGE_METRICS_ADDR="}, "clickhouse", "clickhouse", "serve")
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if srv.cmd.ProcessState != nil || time.Now().After(deadline) {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if strings.Contains(srv.log.String(), "without chDB") {
				t.Log("the test binary has no chDB (-tags chdb): the sinks and recon are left out")
				return "clickhouse://unreachable:9000/default", false
			}
			t.Fatalf("clickhouse serve never listened:\n%s", srv.log.String())
		}
	}
	return "http://" + addr + "/default", true
}

// walletRead reads a user's balance from the wallet at addr with a user
// token signed by the user key secret.
func walletRead(addr string, secret []byte) func() error {
	users := auth.NewUsers([]auth.Key{{ID: "u-1", Secret: secret}})
	return func() error {
		tok, err := users.Issue("restart-probe", time.Minute, time.Now())
		if err != nil {
			return err
		}
		return getOK("http://"+addr+"/v1/users/restart-probe/balance", "Bearer "+tok)
	}
}

// reconRead opens the operators' page at addr with an API key: it must
// show the uin pool's level (read from Redis) among the rest.
func reconRead(addr, key string) func() error {
	return func() error { return getOK("http://"+addr+"/", "Bearer "+key, `id="pool-pooled"`) }
}

// poolRead reads the uin pool's state at addr with an API key.
func poolRead(addr, key string) func() error {
	return func() error { return getOK("http://"+addr+"/v1/pool", "Bearer "+key) }
}

// getOK gets url: it must answer 200 with each of mustShow in its body.
func getOK(url, authorization string, mustShow ...string) error {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", authorization)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %.2000s", url, resp.StatusCode, body)
	}
	for _, want := range mustShow {
		if !bytes.Contains(body, []byte(want)) {
			return fmt.Errorf("%s: %q not in:\n%.2000s", url, want, body)
		}
	}
	return nil
}

// interpolate resolves a compose value's ${X:?msg} and ${X:-default}
// from the deployer's secrets; a required one the test does not give
// fails the test (the compose file asks for something new).
func interpolate(t *testing.T, service, key, v string, secrets map[string]string) string {
	re := regexp.MustCompile(`\$\{([A-Z0-9_]+)(:\?[^}]*|:-[^}]*)?\}`)
	return re.ReplaceAllStringFunc(v, func(m string) string {
		sub := re.FindStringSubmatch(m)
		if val, ok := secrets[sub[1]]; ok {
			return val
		}
		if strings.HasPrefix(sub[2], ":-") {
			return strings.TrimPrefix(sub[2], ":-")
		}
		t.Fatalf("%s: %s needs %s, which the test does not provide", service, key, sub[1])
		return ""
	})
}

// imageBinary is the binary the Dockerfile builds (no chDB), where uid
// 65534 may run it.
func imageBinary(t *testing.T, asImageUser bool) string {
	t.Helper()
	dir := mkdirFor(t, asImageUser)
	bin := filepath.Join(dir, "surge")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// mkdirFor is a fresh directory the image's user can use.
func mkdirFor(t *testing.T, asImageUser bool) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "surge-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if asImageUser {
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func imageUserCommand(bin string, asImageUser bool, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	if asImageUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	return cmd
}

type syncWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
