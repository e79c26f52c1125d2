package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const file = `
activities:
  - id: spring
    children:
      - {id: spring-test, phase: test, start: 2026-01-01T00:00:00Z, end: 2026-01-10T00:00:00Z, budget: 1000}
      - {id: spring-gray, phase: gray, start: 2026-01-10T00:00:00Z, end: 2026-01-20T00:00:00Z, budget: 100000}
      - {id: spring-live, phase: official, start: 2026-01-20T00:00:00Z, end: 2026-03-01T00:00:00Z, budget: 9000000}
    scenes:
      - {id: rain, award: cash, max_amount: 500, switches: {rate_limit: true}}
      - {id: coupon, award: coupon, max_amount: 1, template: t1, switches: {stock_control: true}}
degrade:
  counter: %s
`

func write(t *testing.T, path, counter string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.ReplaceAll(file, "%s", counter)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestResolvePhasesAndReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wallet.yaml")
	write(t, path, "false")
	src, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := src.Tree()
	for at, want := range map[string]string{"2026-01-05T00:00:00Z": "spring-test", "2026-01-10T00:00:00Z": "spring-gray", "2026-02-01T00:00:00Z": "spring-live"} {
		ts, _ := time.Parse(time.RFC3339, at)
		c, sc, err := tr.Resolve("spring", "rain", ts)
		if err != nil || c.ID != want || sc.MaxAmount != 500 {
			t.Fatalf("at %s: %s %v", at, c.ID, err)
		}
	}
	ts, _ := time.Parse(time.RFC3339, "2026-04-01T00:00:00Z")
	if _, _, err := tr.Resolve("spring", "rain", ts); !errors.Is(err, ErrNoPhase) {
		t.Fatalf("outside the windows: %v", err)
	}
	if _, _, err := tr.Resolve("autumn", "rain", ts); !errors.Is(err, ErrUnknownActivity) {
		t.Fatal(err)
	}
	if _, _, err := tr.Resolve("spring", "nope", ts); !errors.Is(err, ErrUnknownScene) {
		t.Fatal(err)
	}
	if tr.Degraded("counter") {
		t.Fatal("counter degraded")
	}
	// Hot reload: flip a degrade switch in the file.
	write(t, path, "true")
	deadline := time.Now().Add(5 * time.Second)
	for !src.Tree().Degraded("counter") {
		if time.Now().After(deadline) {
			t.Fatal("reload not seen")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A broken file is refused; the last good tree stays.
	if err := os.WriteFile(path, []byte("activities: [{id: x, scenes: [{id: s, award: gold, max_amount: 1}]}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if len(src.Tree().Activities) != 1 || src.Tree().Activities[0].ID != "spring" {
		t.Fatal("an invalid file replaced the tree")
	}
}

func TestValidateRefusesOverlap(t *testing.T) {
	d := func(s string) time.Time { x, _ := time.Parse(time.RFC3339, s); return x }
	tr := &Tree{Activities: []Activity{{ID: "a", Children: []Child{
		{ID: "a1", Start: d("2026-01-01T00:00:00Z"), End: d("2026-01-10T00:00:00Z")},
		{ID: "a2", Start: d("2026-01-09T00:00:00Z"), End: d("2026-01-20T00:00:00Z")}}}}}
	if err := tr.Validate(); err == nil {
		t.Fatal("overlapping phases accepted")
	}
}

// Times quoted as strings (as JSON files have them) load like YAML's
// own timestamps.
func TestQuotedTimesLoad(t *testing.T) {
	for name, body := range map[string]string{
		"wallet.yaml": `activities:
  - id: spring
    children:
      - {id: live, phase: official, start: "2026-01-20T00:00:00Z", end: "2026-03-01T00:00:00Z", budget: 100}
    scenes:
      - {id: rain, award: cash, max_amount: 5}
`,
		"wallet.json": `{"activities": [{"id": "spring",
  "children": [{"id": "live", "phase": "official", "start": "2026-01-20T00:00:00Z", "end": "2026-03-01T00:00:00Z", "budget": 100}],
  "scenes": [{"id": "rain", "award": "cash", "max_amount": 5}]}]}`,
	} {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		src, err := Load(path, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		at, _ := time.Parse(time.RFC3339, "2026-02-01T00:00:00Z")
		if c, _, err := src.Tree().Resolve("spring", "rain", at); err != nil || c.ID != "live" {
			t.Fatalf("%s: %s %v", name, c.ID, err)
		}
	}
}
