package connect_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"surge/streams/connect"
)

// redisProc is a redis-server (or sentinel) of the test's own.
type redisProc struct {
	port int
	cmd  *exec.Cmd
}

// startRedisProc starts redis-server with args on a free port below the
// ephemeral range and waits until it answers.
func startRedisProc(t *testing.T, args ...string) *redisProc {
	t.Helper()
	for range 20 {
		port := 20000 + rand.IntN(10000)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
		} else {
			continue
		}
		p := &redisProc{port: port, cmd: exec.Command("redis-server", append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")...)}
		p.cmd.Dir = t.TempDir()
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.kill)
		for i := 0; i < 100; i++ {
			if c, err := net.Dial("tcp", p.addr()); err == nil {
				c.Close()
				return p
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("redis-server %v did not start", args)
	}
	t.Fatal("no free port")
	return nil
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// kill is kill -9.
func (p *redisProc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// Sentinel mode, as `surge` configures it (redis.mode sentinel, the
// sentinels in redis.addr, redis.sentinel_master, a password): a master, a
// replica and a sentinel on loopback. Writes go to the master; when the
// master is killed with -9, the sentinel promotes the replica and the same
// client writes again within seconds, with what was replicated before.
func TestSentinelFailover(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server on this machine (scripts/redis.sh installs it)")
	}
	const pass = "sentinel-test-password"
	master := startRedisProc(t, "--requirepass", pass, "--masterauth", pass)
	replica := startRedisProc(t, "--requirepass", pass, "--masterauth", pass, "--replicaof", "127.0.0.1", strconv.Itoa(master.port))
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`sentinel monitor surge 127.0.0.1 %d 1
sentinel auth-pass surge %s
sentinel down-after-milliseconds surge 1000
sentinel failover-timeout surge 5000
requirepass %s
`, master.port, pass, pass)), 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := startRedisProc(t, conf, "--sentinel")

	env := map[string]string{"redis.mode": "sentinel", "redis.addr": sentinel.addr(), "redis.sentinel_master": "surge", "redis.password": pass}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rdb, err := connect.Redis(ctx, func(k string) string { return env[k] }, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	for i := range 100 {
		if err := rdb.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Replicated before the master dies: WAIT for the replica's ack.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if n, err := rdb.Do(ctx, "WAIT", 1, 1000).Int(); err == nil && n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica never acknowledged the writes")
		}
	}
	master.kill()
	killed := time.Now()
	for {
		err := rdb.Set(ctx, "after", "failover", 0).Err()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no write %s after the master was killed: %v", time.Since(killed).Round(time.Millisecond), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("writes again %s after kill -9 of the master (replica %s promoted)", time.Since(killed).Round(time.Millisecond), replica.addr())
	for i := range 100 {
		if v, err := rdb.Get(ctx, fmt.Sprintf("k%d", i)).Int(); err != nil || v != i {
			t.Fatalf("k%d after the failover: %v, %v", i, v, err)
		}
	}
}
