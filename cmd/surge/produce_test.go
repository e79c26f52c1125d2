package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// surge produce reads records from stdin, one per line (the message, or
// the envelope surge consume prints), and lands them in order; it stops
// at the first line that is not a record with what was before it landed
// and the line to resend from. surge consume prints them back, and with
// --follow prints what is published after it started, until interrupted.
func TestProduceLinesAndFollow(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		topic := streamstest.Unique("cli") + "." + schemas.TopicUsage // a registry topic behind a namespace
		streamstest.CreateTopics(t, b.Kafka, 4, topic)
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ",")}
		const n = 3000
		var in strings.Builder
		for i := 1; i <= n; i++ {
			if i%2 == 0 { // the envelope, with its own key
				fmt.Fprintf(&in, `{"key_uin": %d, "value": {"uin": %d, "kind": "login", "atMs": %d}}`+"\n", i, i, i)
			} else {
				fmt.Fprintf(&in, `{"uin": %d, "kind": "message", "at_ms": %d}`+"\n", i, i)
			}
		}
		in.WriteString("\n") // blank lines are skipped
		in.WriteString(`{"uin": 1, "kind": "login", "nonsense": true}` + "\n")
		in.WriteString(`{"uin": 2, "kind": "login"}` + "\n")
		produce := exec.Command(binary(t), "produce", "--topic", topic, "--key", "k")
		produce.Env = append(produce.Environ(), env...)
		produce.Stdin = strings.NewReader(in.String())
		var out, errOut bytes.Buffer
		produce.Stdout, produce.Stderr = &out, &errOut
		if err := produce.Run(); err == nil {
			t.Fatalf("produce took a line that is not a UsageEvent:\n%s%s", out.String(), errOut.String())
		}
		if want := fmt.Sprintf("line %d: not a valid surge.v1.UsageEvent", n+2); !strings.Contains(errOut.String(), want) ||
			!strings.Contains(errOut.String(), fmt.Sprintf("resend from line %d", n+2)) {
			t.Fatalf("produce's refusal does not name the line: %s", errOut.String())
		}
		if !strings.Contains(out.String(), fmt.Sprintf("produced %d of %d records", n, n)) {
			t.Fatalf("produce's summary: %s", out.String())
		}

		// Read back with surge consume: every record once, keyed as given.
		stdout, stderr, err := command(t, env, "consume", "--topic", topic)
		if err != nil {
			t.Fatalf("consume: %v\n%s", err, stderr)
		}
		seen := map[uint64]bool{}
		sc := bufio.NewScanner(strings.NewReader(stdout))
		for sc.Scan() {
			var r struct {
				Key   string
				Value struct {
					Uin  string
					Kind string
				}
			}
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("consume printed %q: %v", sc.Text(), err)
			}
			var uin uint64
			fmt.Sscan(r.Value.Uin, &uin)
			wantKey := fmt.Sprintf("%x", "k")
			if uin%2 == 0 {
				wantKey = fmt.Sprintf("%x", schemas.UinKey(uint32(uin)))
			}
			if seen[uin] || r.Key != wantKey {
				t.Fatalf("uin %d: again %v, key %s (want %s)", uin, seen[uin], r.Key, wantKey)
			}
			seen[uin] = true
		}
		if len(seen) != n {
			t.Fatalf("%d records read back, want %d", len(seen), n)
		}

		// One key; one partition from an offset.
		stdout, stderr, err = command(t, env, "consume", "--topic", topic, "--key-uin", "42")
		if err != nil || strings.Count(stdout, "\n") != 1 || !strings.Contains(stdout, `"uin":"42"`) {
			t.Fatalf("consume --key-uin 42: %v\n%s%s", err, stdout, stderr)
		}
		stdout, stderr, err = command(t, env, "consume", "--topic", topic, "--partition", "2", "--offset", "10")
		if err != nil {
			t.Fatalf("consume --partition 2 --offset 10: %v\n%s", err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		for _, l := range lines {
			var r struct{ Partition, Offset int64 }
			if json.Unmarshal([]byte(l), &r) != nil || r.Partition != 2 || r.Offset < 10 {
				t.Fatalf("consume --partition 2 --offset 10 printed %s", l)
			}
		}
		if len(lines) < n/8 {
			t.Fatalf("consume --partition 2 --offset 10: %d records", len(lines))
		}

		// Follow from the end: what is published next, then Ctrl-C.
		follow := exec.Command(binary(t), "consume", "--topic", topic, "--follow", "--from-end")
		follow.Env = append(follow.Environ(), env...)
		fout := &syncWriter{b: &bytes.Buffer{}}
		var ferr bytes.Buffer
		follow.Stdout, follow.Stderr = fout, &ferr
		if err := follow.Start(); err != nil {
			t.Fatal(err)
		}
		defer follow.Process.Kill()
		cl := streamstest.Client(t, b.Kafka)
		deadline := time.Now().Add(60 * time.Second)
		for i := uint64(0); !strings.Contains(fout.String(), `"kind":"follow"`); i++ {
			if time.Now().After(deadline) {
				t.Fatalf("consume --follow printed nothing of what was published after it:\n%s\n%s", fout.String(), ferr.String())
			}
			// Published until it shows: its start at the end may come after the first.
			rec, _ := streams.NewRecord(topic, schemas.UinKey(uint32(n+1+i)), &pb.UsageEvent{Uin: n + 1 + i, Kind: "follow"})
			streamstest.ProduceSync(t, cl, rec)
			time.Sleep(200 * time.Millisecond)
		}
		if strings.Contains(fout.String(), `"kind":"message"`) {
			t.Fatalf("consume --follow --from-end printed records from before it started")
		}
		if err := follow.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := follow.Wait(); err != nil {
			t.Fatalf("consume --follow after Ctrl-C: %v (want exit 0)\n%s", err, ferr.String())
		}
	})
}
