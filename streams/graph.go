package streams

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"surge/schemas"
)

// TopicUse is who produces and who consumes one topic, by spec name.
type TopicUse struct {
	Topic     string
	Producers []string
	Consumers []string
}

// Describe lists, for each topic, the specs that produce and consume it
// (Kafka Streams' Topology.describe() over the whole product). A family
// ("push.units.*") is drawn as the registry's topic ("push.units"); every
// processor with a group may dead-letter, so each one produces the
// dead-letter topic.
func Describe(specs []Spec, topics []string) []TopicUse {
	in := func(names []string, topic string) bool {
		return slices.Contains(names, topic) || slices.Contains(names, topic+".*")
	}
	out := make([]TopicUse, 0, len(topics))
	for _, t := range topics {
		u := TopicUse{Topic: t}
		for _, s := range specs {
			if in(s.Outputs, t) || (t == schemas.TopicDeadLetter && s.Group != "") {
				u.Producers = append(u.Producers, s.Name)
			}
			if in(s.Inputs, t) || in(s.Reads, t) {
				u.Consumers = append(u.Consumers, s.Name)
			}
		}
		out = append(out, u)
	}
	return out
}

// WriteText prints one line per topic: producers -> topic -> consumers.
func WriteText(w io.Writer, uses []TopicUse) error {
	width := 0
	for _, u := range uses {
		width = max(width, len(u.Topic))
	}
	for _, u := range uses {
		if _, err := fmt.Fprintf(w, "%-*s  produced by: %s\n%-*s  consumed by: %s\n", width, u.Topic, orNone(u.Producers), width, "", orNone(u.Consumers)); err != nil {
			return err
		}
	}
	return nil
}

// WriteMermaid draws the graph as a Mermaid flowchart: processors are
// boxes, topics are rounded, other teams' services are parallelograms.
func WriteMermaid(w io.Writer, specs []Spec, uses []TopicUse) error {
	var b strings.Builder
	b.WriteString("flowchart LR\n")
	for _, s := range specs {
		if s.External {
			fmt.Fprintf(&b, "  %s[/\"%s\"/]\n", nodeID("p", s.Name), s.Name)
		} else {
			fmt.Fprintf(&b, "  %s[\"%s\"]\n", nodeID("p", s.Name), s.Name)
		}
	}
	for _, u := range uses {
		fmt.Fprintf(&b, "  %s([\"%s\"])\n", nodeID("t", u.Topic), u.Topic)
		for _, p := range u.Producers {
			fmt.Fprintf(&b, "  %s --> %s\n", nodeID("p", p), nodeID("t", u.Topic))
		}
		for _, c := range u.Consumers {
			fmt.Fprintf(&b, "  %s --> %s\n", nodeID("t", u.Topic), nodeID("p", c))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteDOT draws the graph in Graphviz DOT.
func WriteDOT(w io.Writer, specs []Spec, uses []TopicUse) error {
	var b strings.Builder
	b.WriteString("digraph surge {\n  rankdir=LR;\n")
	for _, s := range specs {
		shape := "box"
		if s.External {
			shape = "parallelogram"
		}
		fmt.Fprintf(&b, "  %q [shape=%s];\n", s.Name, shape)
	}
	for _, u := range uses {
		fmt.Fprintf(&b, "  %q [shape=ellipse, style=filled, fillcolor=lightgrey];\n", u.Topic)
		for _, p := range u.Producers {
			fmt.Fprintf(&b, "  %q -> %q;\n", p, u.Topic)
		}
		for _, c := range u.Consumers {
			fmt.Fprintf(&b, "  %q -> %q;\n", u.Topic, c)
		}
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// nodeID makes a Mermaid-safe node id from a name.
func nodeID(kind, name string) string {
	return kind + "_" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, name)
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "(none)"
	}
	return strings.Join(names, ", ")
}
