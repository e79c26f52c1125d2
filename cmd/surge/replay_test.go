package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/processors/uin/pool"
	"surge/processors/uin/uinkeys"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"
)

// command runs surge with env and returns its stdout, stderr and error.
func command(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Env = append(cmd.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// surge replay re-reads a topic into another, records whole (key, value,
// headers); from an offset it prints what follows; a target that does not
// exist, or a start the broker no longer holds, fails it with the reason.
func TestReplayCommand(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		src, dst := streamstest.Unique("replay-src"), streamstest.Unique("replay-dst")
		streamstest.CreateTopics(t, b.Kafka, 1, src, dst)
		cl := streamstest.Client(t, b.Kafka)
		var recs []*kgo.Record
		for i := range 10 {
			recs = append(recs, &kgo.Record{Topic: src, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i)),
				Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(fmt.Sprint(i))}}})
		}
		streamstest.ProduceSync(t, cl, recs...)
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ",")}

		if _, stderr, err := command(t, env, "replay", "--topic", src, "--into", dst); err != nil {
			t.Fatalf("replay into %s: %v\n%s", dst, err, stderr)
		}
		got := streamstest.ReadN(t, b.Kafka, dst, false, 10, 30*time.Second, time.Second)
		if len(got) != 10 {
			t.Fatalf("%d records replayed, want 10", len(got))
		}
		for i, r := range got {
			if string(r.Key) != fmt.Sprintf("k%d", i) || string(r.Value) != fmt.Sprintf("v%d", i) ||
				len(r.Headers) != 1 || string(r.Headers[0].Value) != fmt.Sprint(i) {
				t.Fatalf("record %d replayed as key %q value %q headers %v", i, r.Key, r.Value, r.Headers)
			}
		}

		stdout, stderr, err := command(t, env, "replay", "--topic", src, "--offset", "6")
		if err != nil {
			t.Fatalf("replay from offset 6: %v\n%s", err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if len(lines) != 4 {
			t.Fatalf("replay from offset 6 printed %d records, want 4:\n%s", len(lines), stdout)
		}
		var first map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || fmt.Sprint(first["offset"]) != "6" {
			t.Fatalf("first printed record %s (%v), want offset 6", lines[0], err)
		}

		missing := streamstest.Unique("no-such-topic")
		if _, stderr, err := command(t, env, "replay", "--topic", src, "--into", missing); err == nil {
			t.Fatalf("replay into a topic that does not exist succeeded:\n%s", stderr)
		} else if !strings.Contains(stderr, missing) {
			t.Fatalf("replay into a missing topic: the error does not name it:\n%s", stderr)
		}

		// Records 0-4 deleted: a replay from offset 2 asks for what is gone.
		del := kadm.Offsets{}
		del.AddOffset(src, 0, 5, -1)
		if _, err := kadm.NewClient(cl).DeleteRecords(context.Background(), del); err != nil {
			t.Fatal(err)
		}
		if _, stderr, err := command(t, env, "replay", "--topic", src, "--offset", "2"); err == nil || !strings.Contains(stderr, "out of retention") {
			t.Fatalf("replay from a deleted offset: %v\n%s", err, stderr)
		}
	})
}

// surge uin gaps reads uin.registrations, finds the uins never allocated
// inside the given ranges, and pools each once: a second run adds none.
func TestUinGapsCommand(t *testing.T) {
	streamstest.EachStack(t, func(t *testing.T, b streamstest.Backend, rdb *redis.Client) {
		ns := streamstest.Unique("gaps") + "."
		streamstest.CreateTopics(t, b.Kafka, 3, ns+schemas.TopicRegistrations)
		var recs []*kgo.Record
		for u := uint32(10); u <= 20; u++ {
			if u == 13 || u == 17 {
				continue // jumped over by the allocator
			}
			r, err := streams.NewRecord(ns+schemas.TopicRegistrations, schemas.UinKey(u), &pb.UinRegistration{Uin: uint64(u), Username: fmt.Sprint("user", u)})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		streamstest.ProduceSync(t, streamstest.Client(t, b.Kafka), recs...)
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_REDIS_ADDR=" + rdb.Options().Addr, "SURGE_UIN_NAMESPACE=" + ns}

		stdout, stderr, err := command(t, env, "uin", "gaps", "--ranges", "10-21")
		if err != nil || !strings.Contains(stdout, "9 uins allocated; 2 gaps in the ranges") {
			t.Fatalf("uin gaps: %v\n%s\n%s", err, stdout, stderr)
		}
		central := pool.NewCentral(rdb, uinkeys.Pool(ns), 1000)
		ctx := context.Background()
		if n, err := central.Size(ctx); err != nil || n != 2 {
			t.Fatalf("pool holds %d uins after the gaps run (%v), want 13 and 17", n, err)
		}
		for _, u := range []uint32{13, 17} {
			if in, _ := rdb.SIsMember(ctx, uinkeys.Pool(ns)+"bucket:"+fmt.Sprint(central.Bucket(u)), u).Result(); !in {
				t.Errorf("gap %d not in its bucket", u)
			}
		}
		if _, _, err := command(t, env, "uin", "gaps", "--ranges", "10-21"); err != nil {
			t.Fatal(err)
		}
		if n, _ := central.Size(ctx); n != 2 {
			t.Fatalf("a second run left %d uins in the pool, want still 2", n)
		}
		if _, stderr, err := command(t, env, "uin", "gaps", "--ranges", "21-10"); err == nil || !strings.Contains(stderr, "bad range") {
			t.Fatalf("a backwards range: %v %s", err, stderr)
		}
	})
}
