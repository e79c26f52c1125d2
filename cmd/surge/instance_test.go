package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	push "surge/processors/push/app"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/streamstest"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Instances of one component on one host get distinct ids; a slot freed
// (the process ended) is taken again by the next, so a restarted instance
// has its old id; other components count their own slots.
func TestInstanceSlots(t *testing.T) {
	dir := t.TempDir()
	a, fa, err := claimSlot(dir, "push-offline", "h1")
	if err != nil {
		t.Fatal(err)
	}
	b, fb, err := claimSlot(dir, "push-offline", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if a != "h1" || b != "h1-2" {
		t.Fatalf("ids %q and %q, want h1 and h1-2", a, b)
	}
	other, fo, err := claimSlot(dir, "push-ctr", "h1")
	if err != nil || other != "h1" {
		t.Fatalf("another component: %q, %v", other, err)
	}
	fo.Close()
	fa.Close() // the first instance dies
	again, fa2, err := claimSlot(dir, "push-offline", "h1")
	if err != nil || again != "h1" {
		t.Fatalf("restarted instance got %q, %v; want its old h1", again, err)
	}
	third, ft, err := claimSlot(dir, "push-offline", "h1")
	if err != nil || third != "h1-3" {
		t.Fatalf("third instance got %q, %v; want h1-3", third, err)
	}
	fa2.Close()
	fb.Close()
	ft.Close()
}

// Where no lock file can be made (a read-only temporary directory), the
// id is the host name, as before slots, and the service still starts.
func TestInstanceIDWithoutSlotFiles(t *testing.T) {
	_, _, err := claimSlot(filepath.Join(t.TempDir(), "missing"), "push-ctr", "h1")
	if !errors.Is(err, errNoSlotFile) {
		t.Fatalf("claimSlot in a missing directory: %v, want errNoSlotFile", err)
	}
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	v, _, err := loadConfig("run", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	release, err := claimInstanceID(v, "push-ctr", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("a service without slot files did not start: %v", err)
	}
	defer release()
	if host, _ := os.Hostname(); v.GetString("processor.instance_id") != host {
		t.Fatalf("instance id %q, want the host name %q", v.GetString("processor.instance_id"), host)
	}
}

// A configured id is kept, and claims no slot.
func TestConfiguredInstanceIDKept(t *testing.T) {
	v, _, err := loadConfig("run", []string{"--processor.instance_id=exec-7"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	release, err := claimInstanceID(v, "push-executor", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if got := v.GetString("processor.instance_id"); got != "exec-7" {
		t.Fatalf("instance id %q, want the configured exec-7", got)
	}
}

// Two instances of one service on one host, neither given an id, take
// ids of their own and share the work without fencing each other's
// transactions (with the host name for both, every commit fenced the
// other one).
func TestInstancesWithoutIDsShareTheWork(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		ns, dir := streamstest.Unique("slots")+".", t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cl := streamstest.Client(t, b.Kafka)
		if err := streams.EnsureTopics(ctx, cl, streams.OneCopy, push.Topics(ns)...); err != nil {
			t.Fatal(err)
		}
		// TMPDIR of their own: the slots of this test, not of other runs.
		env := []string{"SURGE_KAFKA_BROKERS=" + strings.Join(b.Kafka.Seeds, ","), "SURGE_PUSH_NAMESPACE=" + ns,
			"SURGE_LOG_LEVEL=info", "TMPDIR=" + t.TempDir()}
		a := runService(t, env, "presence-a", "push-presence", "--push.dir="+dir+"/a")
		c := runService(t, env, "presence-b", "push-presence", "--push.dir="+dir+"/b")
		for round := range 4 { // logins while both run, in a few commits
			var recs []*kgo.Record
			for u := uint32(1); u <= 2000; u++ {
				r, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(u+uint32(round)*2000), &pb.LoginEvent{Uin: uint64(u + uint32(round)*2000), Online: true})
				recs = append(recs, r)
			}
			streamstest.ProduceSync(t, cl, recs...)
			time.Sleep(500 * time.Millisecond)
		}
		if err := streams.WaitConsumed(ctx, b.Kafka, ns+"presence", ns+schemas.TopicLogin); err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, s := range []*service{a, c} {
			s.mu.Lock()
			log := s.log.String()
			s.mu.Unlock()
			if strings.Contains(log, "FENCED") || strings.Contains(log, "INVALID_PRODUCER_EPOCH") {
				t.Errorf("%s was fenced:\n%s", s.name, log)
			}
			_, rest, ok := strings.Cut(log, "instance_id=")
			if !ok {
				t.Fatalf("%s logged no instance id:\n%s", s.name, log)
			}
			ids[strings.Fields(rest)[0]] = true
		}
		if len(ids) != 2 {
			t.Fatalf("instance ids %v, want two distinct", ids)
		}
	})
}
