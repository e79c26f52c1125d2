package main

import (
	"context"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"surge/streams/streamstest"
)

// redisServer is a redis-server of the test's own, which it may kill and
// start again empty (the shared one serves other tests).
type redisServer struct {
	t    *testing.T
	port int
	dir  string
	cmd  *exec.Cmd
}

func startRedisServer(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server on this machine (scripts/redis.sh installs it)")
	}
	r := &redisServer{t: t, port: freeLowPort(t), dir: t.TempDir()}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", r.dir)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", r.addr()); err == nil {
			c.Close()
			return
		}
		if i > 100 {
			r.t.Fatal("redis-server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill is kill -9: no save, and the data is gone (no persistence).
func (r *redisServer) kill() {
	if r.cmd != nil && r.cmd.ProcessState == nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// freeLowPort is a free port below the ephemeral range, where an
// outgoing connection cannot take it between a restart's stop and start.
func freeLowPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := 20000 + rand.IntN(10000)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			l.Close()
			return p
		}
	}
	t.Fatal("no free port between 20000 and 30000")
	return 0
}

// The disaster drill for the wallet: `surge run wallet` runs a campaign
// whose cash budget and coupon stock three times as many grants compete
// for; at half the budget redis-server is killed and started again empty.
// The wallet rebuilds its counters from the topics before it takes another
// grant (answering 503 meanwhile): the budget and the sellable stock are
// not passed; every accepted cash grant is in its user's balance once.
func TestWalletRedisLossDrill(t *testing.T) {
	// Not parallel: it loads both cores for a while, and the kill -9 tests
	// beside it count on answers within their clients' timeouts.
	b := streamstest.RealBroker(t)
	rs := startRedisServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := startWalletCampaign(t, ctx, b, rs.addr())
	w.holdAfter(campaignBudget / 2)
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	for w.accepted() < campaignBudget/2 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	rs.kill()
	rs.start()
	t.Logf("redis-server killed and started again empty at %d of the %d budget", w.accepted(), campaignBudget)
	w.Resume()
	<-done
	w.check(ctx)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
