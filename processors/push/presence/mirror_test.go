package presence

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"surge/schemas"
	"surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/connect"
	"surge/streams/metrics"
	"surge/streams/streamstest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func feed(t *testing.T, p *Processor, events ...*surgev1.LoginEvent) {
	t.Helper()
	var out streams.Output
	for _, ev := range events {
		r, err := streams.NewRecord("login", schemas.UinKey(uint32(ev.Uin)), ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Handle()(context.Background(), r, &out); err != nil {
			t.Fatal(err)
		}
	}
	p.BatchEnd(true)
}

func TestRedisMirrorMatchesTheCommittedBitmap(t *testing.T) {
	streamstest.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		ctx := context.Background()
		prefix := "test.online." + time.Now().Format("150405.000000") + ":"
		m := NewRedisMirror(rdb, prefix, metrics.NewRegistry(), quiet)
		p := New(Config{Output: "presence"}).WithMirror(ctx, m)
		// Uins across many shards, including both ends of the space.
		var evs []*surgev1.LoginEvent
		for i := uint64(0); i < 5000; i++ {
			evs = append(evs, &surgev1.LoginEvent{Uin: i * 858993, Online: true})
		}
		evs = append(evs, &surgev1.LoginEvent{Uin: schemas.MaxUin, Online: true})
		feed(t, p, evs...)
		feed(t, p, &surgev1.LoginEvent{Uin: 858993, Online: false}, &surgev1.LoginEvent{Uin: 7, Online: true})
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := m.WaitSynced(wctx); err != nil {
			t.Fatal(err)
		}
		n, err := m.Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(n) != p.Online().GetCardinality() || n != 5001 {
			t.Fatalf("redis counts %d online, bitmap %d", n, p.Online().GetCardinality())
		}
		for _, c := range []struct {
			uin  uint32
			want bool
		}{{0, true}, {858993, false}, {2 * 858993, true}, {7, true}, {8, false}, {schemas.MaxUin, true}} {
			got, err := m.IsOnline(ctx, c.uin)
			if err != nil || got != c.want {
				t.Errorf("uin %d: redis says %v (%v), want %v", c.uin, got, err, c.want)
			}
		}
		keys, _ := connect.Scan(ctx, rdb, prefix+"*")
		for _, k := range keys {
			rdb.Del(ctx, k)
		}
	})
}

// Redis goes away and comes back empty: logins keep being processed, the
// failure is counted, and the mirror is rewritten in full once Redis answers.
func TestRedisOutageDoesNotBlockAndIsRepaired(t *testing.T) {
	srv := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	defer rdb.Close()
	reg := metrics.NewRegistry()
	m := NewRedisMirror(rdb, "online:", reg, quiet)
	m.timeout, m.resyncEvery = 300*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := New(Config{Output: "presence"}).WithMirror(ctx, m)
	feed(t, p, &surgev1.LoginEvent{Uin: 1, Online: true})
	if err := m.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}

	srv.Close()
	start := time.Now()
	for u := uint64(2); u < 1000; u++ {
		feed(t, p, &surgev1.LoginEvent{Uin: u, Online: true})
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("outage held processing for %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for (!m.Dirty() || m.errs.Value() < 1) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !m.Dirty() || m.errs.Value() < 1 {
		t.Fatalf("outage not noticed: dirty=%v errors=%v", m.Dirty(), m.errs.Value())
	}
	if !p.IsOnline(2) || !p.IsOnline(999) {
		t.Fatal("logins during the outage were lost")
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	srv.FlushAll()
	// No new login is needed: the writer repairs Redis on its own.
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := m.WaitSynced(wctx); err != nil {
		t.Fatalf("mirror not repaired after redis came back: %v", err)
	}
	n, err := m.Count(ctx)
	if err != nil || n != 999 {
		t.Fatalf("after repair redis counts %d online (%v), want 999", n, err)
	}
}

// Redis loses its data between two writes without an error the writer
// sees (flushed, or restarted and reconnected before the next write): the
// next write finds the generation marker gone and the mirror is rewritten
// in full, not left with only the bits written since.
func TestRedisLossBetweenWritesIsNoticed(t *testing.T) {
	srv := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	m := NewRedisMirror(rdb, "online:", metrics.NewRegistry(), quiet)
	m.resyncEvery = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := New(Config{Output: "presence"}).WithMirror(ctx, m)
	for u := uint64(1); u <= 500; u++ {
		feed(t, p, &surgev1.LoginEvent{Uin: u, Online: true})
	}
	if err := m.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	srv.FlushAll() // no error reaches the writer
	feed(t, p, &surgev1.LoginEvent{Uin: 501, Online: true})
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := m.Count(ctx)
		if err == nil && n == 501 && !m.Dirty() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis counts %d online after the loss (%v), want 501: the mirror was not rewritten", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
