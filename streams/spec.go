package streams

import (
	"fmt"
	"slices"
	"strings"
)

// Spec declares a processor's topology, the way goka's DefineGroup does:
// what it consumes in its group, what it reads aside (tables, replays),
// what it produces, and what it keeps. Topic names are the registry's
// (schemas.Topics), without a namespace; a name ending in ".*" is a
// family of topics (push.units.<executor>). The runner consumes the
// declared inputs and refuses to produce to a topic not declared
// (Declare); `surge topics --graph` draws every spec.
type Spec struct {
	Name      string    // the component: `surge run NAME`
	Group     string    // consumer group, before the namespace ("" for a producer only)
	Guarantee Guarantee // of its consume-produce loop
	Inputs    []string  // consumed in the group (offsets committed)
	Reads     []string  // read aside from the start or a checkpoint: changelogs, tables, replays
	Outputs   []string  // produced
	Stores    []string  // local and external state, "kind: what" (a cache of Inputs/Reads unless said)
	Doc       string    // one line: what it does
	External  bool      // another team's service that publishes or reads a topic (not run by surge)
}

// Consumes reports whether the spec reads topic (in its group or aside).
func (s Spec) Consumes(topic string) bool {
	return matchAny(s.Inputs, topic) || matchAny(s.Reads, topic)
}

// Produces reports whether the spec declares topic as an output.
func (s Spec) Produces(topic string) bool { return matchAny(s.Outputs, topic) }

// matchAny reports whether topic is one of names or in one of their
// families ("push.units.*" holds "push.units.e1").
func matchAny(names []string, topic string) bool {
	for _, n := range names {
		if n == topic {
			return true
		}
		if fam, ok := strings.CutSuffix(n, ".*"); ok && strings.HasPrefix(topic, fam+".") {
			return true
		}
	}
	return false
}

// UndeclaredError is a record produced to a topic its processor's spec does
// not declare: a bug in the processor, so the runner stops (nothing of the
// batch is committed) instead of writing where nobody expects it.
type UndeclaredError struct {
	Processor, Topic string
	Declared         []string
}

func (e *UndeclaredError) Error() string {
	return fmt.Sprintf("streams: %s produced to %q, which its spec does not declare (outputs %v); declare it or stop producing it",
		e.Processor, e.Topic, e.Declared)
}

// Declare runs the processor as spec says, every topic behind namespace
// ns: it consumes spec.Inputs in group ns+spec.Group with spec.Guarantee,
// and only spec.Outputs (and the dead-letter topic) may be produced.
// Options after it override; an Inputs option must name declared topics
// (a family's member: push.units.<executor>).
func Declare(spec Spec, ns string) Option {
	return func(c *config) {
		c.spec = &spec
		c.namespace = ns
		c.inputs = nil
		for _, t := range spec.Inputs {
			if !strings.HasSuffix(t, ".*") {
				c.inputs = append(c.inputs, ns+t)
			}
		}
		if spec.Group != "" {
			c.group = ns + spec.Group
		}
		c.guarantee = spec.Guarantee
	}
}

// checkInputs refuses consumed topics the spec does not declare.
func (c *config) checkInputs() error {
	if c.spec == nil {
		return nil
	}
	for _, t := range c.inputs {
		base, ok := strings.CutPrefix(t, c.namespace)
		if !ok || !matchAny(c.spec.Inputs, base) {
			return fmt.Errorf("streams: %s consumes %q, which its spec does not declare (inputs %v)", c.name, t, c.spec.Inputs)
		}
	}
	return nil
}

// checkOutputs returns an *UndeclaredError for the first record bound for
// a topic the spec does not declare.
func (c *config) checkOutputs(topics func(yield func(string) bool)) error {
	if c.spec == nil {
		return nil
	}
	for t := range topics {
		if t == c.deadLetter {
			continue
		}
		base, ok := strings.CutPrefix(t, c.namespace)
		if !ok || !matchAny(c.spec.Outputs, base) {
			return &UndeclaredError{Processor: c.name, Topic: t, Declared: slices.Clone(c.spec.Outputs)}
		}
	}
	return nil
}
