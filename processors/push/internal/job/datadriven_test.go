package job_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"surge/processors/push/internal/job"
	pb "surge/schemas/surgev1"
)

// TestMachineDataDriven runs testdata/machine: a script of moves and
// observed (replayed) transitions with the expected answer of each.
// Commands:
//
//	move job=ID to=STATE      a planner's move: "FROM -> TO", or the refusal
//	observe job=ID from=S to=S a transition read back from the topic
//	states                    every job's state, sorted by id
//
// Regenerate the expected output with -rewrite.
func TestMachineDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		m := job.NewMachine()
		known := map[string]bool{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var id string
			if d.HasArg("job") {
				d.ScanArgs(t, "job", &id)
				known[id] = true
			}
			state := func(key string) pb.JobState {
				var s string
				d.ScanArgs(t, key, &s)
				v, ok := pb.JobState_value[s]
				if !ok {
					d.Fatalf(t, "unknown state %q", s)
				}
				return pb.JobState(v)
			}
			switch d.Cmd {
			case "move":
				tr, err := m.Move(id, state("to"))
				if err != nil {
					return err.Error() + "\n"
				}
				return fmt.Sprintf("%s -> %s%s\n", tr.From, tr.To, terminal(tr.To))
			case "observe":
				if err := m.Observe(&pb.JobTransition{JobId: id, From: state("from"), To: state("to")}); err != nil {
					return err.Error() + "\n"
				}
				return fmt.Sprintf("now %s%s\n", m.State(id), terminal(m.State(id)))
			case "states":
				ids := slices.Sorted(func(yield func(string) bool) {
					for k := range known {
						if !yield(k) {
							return
						}
					}
				})
				var b strings.Builder
				for _, k := range ids {
					fmt.Fprintf(&b, "%s: %s\n", k, m.State(k))
				}
				return b.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func terminal(s pb.JobState) string {
	if job.Terminal(s) {
		return " (terminal)"
	}
	return ""
}
