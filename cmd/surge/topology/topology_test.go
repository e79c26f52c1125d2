package topology_test

import (
	"os"
	"strings"
	"testing"

	"surge/cmd/surge/topology"
	"surge/schemas"
	"surge/streams"
)

// Every registry topic is produced by someone and consumed by someone: a
// topic nobody writes or nobody reads is dead weight or a broken contract.
func TestEveryTopicHasAProducerAndAConsumer(t *testing.T) {
	for _, u := range topology.Describe() {
		if len(u.Producers) == 0 {
			t.Errorf("%s: no producer", u.Topic)
		}
		if len(u.Consumers) == 0 {
			t.Errorf("%s: no consumer", u.Topic)
		}
	}
}

// Every topic a spec names is in the registry (a family by its base name),
// and spec names are unique.
func TestSpecsNameRegistryTopics(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range topology.All() {
		if seen[s.Name] {
			t.Errorf("spec %q declared twice", s.Name)
		}
		seen[s.Name] = true
		if s.Doc == "" {
			t.Errorf("spec %q has no doc", s.Name)
		}
		for _, list := range [][]string{s.Inputs, s.Reads, s.Outputs} {
			for _, name := range list {
				if _, err := schemas.TopicByName(strings.TrimSuffix(name, ".*")); err != nil {
					t.Errorf("spec %q: %v", s.Name, err)
				}
			}
		}
		if !s.External && s.Group != "" && len(s.Inputs) == 0 {
			t.Errorf("spec %q has a group and no inputs", s.Name)
		}
	}
}

// The renderers draw every topic and every edge.
func TestGraphRenders(t *testing.T) {
	uses := topology.Describe()
	var text, mermaid, dot strings.Builder
	if err := streams.WriteText(&text, uses); err != nil {
		t.Fatal(err)
	}
	if err := streams.WriteMermaid(&mermaid, topology.All(), uses); err != nil {
		t.Fatal(err)
	}
	if err := streams.WriteDOT(&dot, topology.All(), uses); err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(text.String()), " ")
	for _, want := range []string{"push.job-transitions produced by: push-planner consumed by: push-planner, push-ctr, sink-job-states"} {
		if !strings.Contains(flat, want) {
			t.Errorf("text graph lacks %q:\n%s", want, text.String())
		}
	}
	if !strings.Contains(mermaid.String(), "p_push_planner --> t_push_job_transitions") ||
		!strings.Contains(dot.String(), `"push-planner" -> "push.job-transitions";`) {
		t.Errorf("planner -> transitions edge missing:\n%s\n%s", mermaid.String(), dot.String())
	}
}

// The README's graph is the one the specs draw (regenerate it with
// `bin/surge topics --graph --format mermaid`).
func TestReadmeGraphIsCurrent(t *testing.T) {
	raw, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "<!-- topology:begin")
	if !ok {
		t.Fatal("README.md has no topology:begin marker")
	}
	_, rest, _ = strings.Cut(rest, "```mermaid\n")
	got, _, ok := strings.Cut(rest, "```\n<!-- topology:end -->")
	if !ok {
		t.Fatal("README.md has no topology:end marker after its mermaid block")
	}
	var want strings.Builder
	if err := streams.WriteMermaid(&want, topology.All(), topology.Describe()); err != nil {
		t.Fatal(err)
	}
	if got != want.String() {
		t.Errorf("README.md's topology graph is out of date: regenerate it with `bin/surge topics --graph --format mermaid`")
	}
}
