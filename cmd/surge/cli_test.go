package main

import (
	"encoding/json"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"surge/streams/embedded"
)

// surge runs the built binary and returns its combined output.
func surge(t *testing.T, args ...string) string {
	t.Helper()
	out, _ := exec.Command(binary(t), args...).CombinedOutput()
	return string(out)
}

// Each command shows its own flags (and the shared kafka.* and log.*),
// not every other command's.
func TestEachCommandShowsItsOwnFlags(t *testing.T) {
	for _, c := range []struct {
		args        []string
		has, hasNot []string
	}{
		{[]string{"wallet", "--help"}, []string{"--wallet.http_addr", "--redis.addr", "--kafka.brokers", "--log.level"}, []string{"--push.unit_size", "--uin.buckets", "--loadgen.users"}},
		{[]string{"push", "--help"}, []string{"--job", "--reason", "--push.namespace"}, []string{"--wallet.dir", "--push.unit_size", "--uin.buckets"}},
		{[]string{"uin", "--help"}, []string{"--uin.buckets", "--username", "--redis.addr"}, []string{"--wallet.dir", "--push.unit_size"}},
		{[]string{"produce", "--help"}, []string{"--topic", "--json", "--kafka.brokers"}, []string{"--wallet.dir", "--uin.buckets"}},
		{[]string{"run", "--help"}, []string{"--push.unit_size", "--uin.buckets", "--wallet.dir", "--processor.instance_id"}, nil},
	} {
		out := surge(t, c.args...)
		for _, f := range c.has {
			if !strings.Contains(out, f+" ") {
				t.Errorf("surge %s: no %s in\n%s", strings.Join(c.args, " "), f, out)
			}
		}
		for _, f := range c.hasNot {
			if strings.Contains(out, f+" ") {
				t.Errorf("surge %s lists another command's %s", strings.Join(c.args, " "), f)
			}
		}
		if strings.Contains(out, "--kafka.brokers embedded") {
			t.Errorf("surge %s: a help text's quoted word shown as the value's name", strings.Join(c.args, " "))
		}
	}
	// A flag of another command is refused, by name.
	if out := surge(t, "push", "pause", "--job", "j", "--wallet.dir", "/tmp"); !strings.Contains(out, "unknown flag: --wallet.dir") {
		t.Errorf("another command's flag: %s", out)
	}
}

func TestCompletionScript(t *testing.T) {
	out := surge(t, "completion", "bash")
	for _, want := range []string{"complete -F _surge surge", "embedded run loadgen wallet uin push", "push-planner", "uin-restore", "--help"} {
		if !strings.Contains(out, want) {
			t.Errorf("completion script lacks %q:\n%s", want, out)
		}
	}
	if out := surge(t, "completion", "fish"); !strings.Contains(out, "usage: surge completion bash|zsh") {
		t.Errorf("unknown shell: %s", out)
	}
}

// A service whose metrics address is taken (another service on this host)
// stops at start and says so, instead of running without /readyz while
// the other service's answers in its name (surge probe, a health check).
func TestMetricsAddressTakenStopsTheService(t *testing.T) {
	k, err := embedded.StartKafka()
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cmd := exec.Command(binary(t), "run", "push-presence", "--push.dir="+t.TempDir(), "--kafka.brokers="+strings.Join(k.Brokers(), ","),
		"--metrics.addr="+taken.Addr().String())
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("the service ran on with its metrics address taken")
	}
	if err == nil || !strings.Contains(string(out), "metrics.addr "+taken.Addr().String()) || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("surge run with a taken metrics address: %v\n%s", err, out)
	}
}

// log.format=json makes every log line one JSON object (a service that
// stops at start logs its reason that way too).
func TestLogFormatJSON(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	out, _ := exec.Command(binary(t), "embedded", "--log.format=json", "--demo.users=1", "--metrics.addr="+taken.Addr().String()).CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	logged := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "surge:") { // the exit reason, after the logs
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["msg"] == nil || m["level"] == nil {
			t.Fatalf("not a JSON log line: %q\n%s", l, out)
		}
		logged++
	}
	if logged == 0 || !strings.Contains(string(out), "metrics.addr") {
		t.Fatalf("want JSON log lines and the metrics.addr refusal:\n%s", out)
	}
}
