package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A plain `go build ./cmd/surge` (what `go install` gives) runs on a
// machine without libchdb.so: every command that needs no embedded
// ClickHouse works, and one that does says how to get it.
func TestPlainBuildRunsWithoutChDB(t *testing.T) {
	// Not parallel: it loads both cores for a while, and the kill -9 tests
	// beside it count on answers within their clients' timeouts.
	bin := filepath.Join(t.TempDir(), "surge")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false") // no -tags chdb
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// A chDB build would load this path at start, and panic.
	env := append(os.Environ(), "CHDB_LIB_PATH="+filepath.Join(t.TempDir(), "no-libchdb.so"), "TMPDIR="+t.TempDir())
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	for _, args := range [][]string{{"--help"}, {"config"}, {"topics"}, {"topics", "--graph"}, {"run", "--help"}, {"wallet", "keygen"}} {
		out, code := run(args...)
		if code != 0 || strings.Contains(out, "panic") {
			t.Errorf("surge %v: exit %d\n%s", args, code, out)
		}
	}
	out, code := run("embedded", "--demo.users", "1", "--metrics.addr=")
	if code == 0 || !strings.Contains(out, "built without chDB") || !strings.Contains(out, "-tags chdb") {
		t.Errorf("surge embedded without chDB: exit %d\n%s\nwant a refusal saying how to get chDB", code, out)
	}
}
