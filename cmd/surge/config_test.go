package main

import (
	"os"
	"path/filepath"
	"strings"
	"surge/streams/metrics"
	"testing"
)

// Mistakes in the configuration stop the command with the key and where
// its value came from, instead of being ignored or replaced by a default;
// the complete example of docs/operations.md is accepted.
func TestConfigRefusesMistakes(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	typo := file("typo.yaml", "procesor:\n  max_batch: 5\n")
	badValue := file("value.yaml", "processor:\n  shutdown_timeout: soon\n")
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string // in the error; "" for none
	}{
		{"defaults", nil, nil, ""},
		{"a misspelled key in the file", nil, []string{"--config", typo}, `unknown key "procesor.max_batch"`},
		{"a value in the file", nil, []string{"--config", badValue}, `processor.shutdown_timeout: "soon" is not a valid duration`},
		{"a number from the environment", map[string]string{"SURGE_PROCESSOR_MAX_BATCH": "abc"}, nil, "variable SURGE_PROCESSOR_MAX_BATCH"},
		{"a log level", map[string]string{"SURGE_LOG_LEVEL": "verbose"}, nil, `log.level: "verbose"`},
		{"a log format", map[string]string{"SURGE_LOG_FORMAT": "xml"}, nil, `log.format: "xml" is not text or json (variable SURGE_LOG_FORMAT`},
		{"a boolean", map[string]string{"SURGE_PROCESSOR_STATIC_MEMBERSHIP": "maybe"}, nil, "processor.static_membership"},
		{"good values", map[string]string{"SURGE_PROCESSOR_MAX_BATCH": "500", "SURGE_LOG_LEVEL": "DEBUG", "SURGE_LOG_FORMAT": "json", "SURGE_UIN_REBUILD_SETTLE": "2s"}, nil, ""},
	}
	docs, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, example, _ := strings.Cut(string(docs), "A complete configuration (`surge run NAME --config surge.yaml`):\n\n```yaml\n")
	example, _, _ = strings.Cut(example, "```")
	if !strings.Contains(example, "kafka:") {
		t.Fatal("docs/operations.md: the complete configuration example is gone")
	}
	cases = append(cases, struct {
		name string
		env  map[string]string
		args []string
		want string
	}{"the documented example", nil, []string{"--config", file("example.yaml", example)}, ""})
	for _, c := range cases {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		_, _, err := loadConfig("run", c.args, nil)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		for k := range c.env {
			os.Unsetenv(k)
		}
	}
}

// `surge version` says which build runs, and so does surge_build_info on
// every service's /metrics.
func TestVersionAndBuildInfo(t *testing.T) {
	out, code := runToEnd(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "surge ") || !strings.Contains(out, "go1.") {
		t.Fatalf("surge version: exit %d: %q", code, out)
	}
	reg := metrics.NewRegistry()
	registerBuildInfo(reg)
	var text strings.Builder
	if err := reg.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "surge_build_info{") || !strings.Contains(text.String(), `go_version="go1.`) {
		t.Fatalf("no build info:\n%s", text.String())
	}
}
