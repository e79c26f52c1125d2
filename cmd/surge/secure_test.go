package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	push "surge/processors/push/app"
	uinapp "surge/processors/uin/app"
	walletapp "surge/processors/wallet/app"
	"surge/processors/wallet/auth"
	"surge/schemas"
	pb "surge/schemas/surgev1"
	"surge/streams"
	"surge/streams/connect"
	"surge/streams/streamstest"
)

// securedCluster is the test broker's SASL_SSL listener as the services
// see it: its SURGE_* environment and the cluster it names.
func securedCluster(t *testing.T) ([]string, streams.Cluster) {
	t.Helper()
	conf := streamstest.Secured(t)
	var env []string
	for k, v := range conf {
		env = append(env, k+"="+v)
	}
	kc, err := connect.Kafka(connect.Vars(conf))
	if err != nil {
		t.Fatal(err)
	}
	return env, kc
}

// Services of every kind run on a broker that wants TLS and SCRAM, as a
// managed cluster does: a stream processor (push-presence, exactly-once),
// a consumer-group service with its own clients (uin-tracker), and the
// wallet (HTTP, intake, ledger); each does its work there.
func TestServicesOnSecuredKafka(t *testing.T) {
	t.Parallel()
	senv, kc := securedCluster(t)
	rdb, ok := streamstest.RedisClient(t)
	if !ok {
		t.Skip("no real redis: set SURGE_TEST_REDIS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := streamstest.Unique("secure") + "."
	cl := streamstest.Client(t, kc)
	topics := append(append(push.Topics(ns), uinapp.Topics(ns)...), walletapp.Topics(ns)...)
	if err := streams.EnsureTopics(ctx, cl, streams.Replication{}, dedupe(topics)...); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	app := auth.Key{ID: "rain-1", App: "rain", Secret: []byte(strings.Repeat("k", 32))}
	user := auth.Key{ID: "u-1", Secret: []byte(strings.Repeat("u", 32))}
	enc := base64.RawURLEncoding.EncodeToString
	env := append(senv, "SURGE_PUSH_NAMESPACE="+ns, "SURGE_UIN_NAMESPACE="+ns, "SURGE_WALLET_NAMESPACE="+ns,
		"SURGE_REDIS_ADDR="+rdb.Options().Addr, "SURGE_WALLET_HTTP_ADDR="+addr, "SURGE_LOG_LEVEL=info",
		"SURGE_WALLET_KEY_SEED="+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)),
		"SURGE_WALLET_APP_KEYS=rain:rain-1:"+enc(app.Secret), "SURGE_WALLET_USER_KEYS=u-1:"+enc(user.Secret),
		"TMPDIR="+t.TempDir())
	dir := t.TempDir()
	services := []*service{
		runService(t, env, "presence", "push-presence", "--push.dir="+dir+"/presence"),
		runService(t, env, "tracker", "uin-tracker", "--uin.dir="+dir+"/tracker"),
		runCommand(t, env, "wallet", "run", "wallet", "--wallet.dir="+dir+"/wallet"),
	}

	// push-presence turns logins into presence changes.
	var logins []*kgo.Record
	for u := uint32(1); u <= 200; u++ {
		r, _ := streams.NewRecord(ns+schemas.TopicLogin, schemas.UinKey(u), &pb.LoginEvent{Uin: uint64(u), Online: true})
		logins = append(logins, r)
	}
	streamstest.ProduceSync(t, cl, logins...)
	if got := streamstest.ReadN(t, kc, ns+schemas.TopicPresence, true, 1, 90*time.Second, 0); len(got) == 0 {
		t.Fatal("push-presence wrote no presence change over the secured listener")
	}
	// uin-tracker consumes registrations in its group.
	reg, _ := streams.NewRecord(ns+schemas.TopicRegistrations, schemas.UinKey(7), &pb.UinRegistration{Uin: 7, Username: "u7", AtMs: time.Now().UnixMilli()})
	streamstest.ProduceSync(t, cl, reg)
	if err := streams.WaitConsumed(ctx, kc, ns+"uin-tracker", ns+schemas.TopicRegistrations); err != nil {
		t.Fatalf("uin-tracker did not consume its input: %v", err)
	}
	// The wallet books a signed grant and answers the balance.
	c := walletClient{t: t, base: "http://" + addr, app: app, users: auth.NewUsers([]auth.Key{user}), hc: &http.Client{Timeout: 5 * time.Second}}
	body := `{"orderNo":"u1_rain_r1_1_1","actId":"u1","activityId":"spring","sceneId":"rain","rainId":"r1","awardType":"CASH","stage":1,"amount":42}`
	waitFor(t, ctx, "the grant accepted", func() bool {
		code, _, err := c.do("POST", "/v1/grants", body, c.asApp)
		return err == nil && code == 200
	})
	waitFor(t, ctx, "the grant booked", func() bool {
		code, out, err := c.do("GET", "/v1/users/u1/balance", "", c.asUser("u1"))
		return err == nil && code == 200 && fmt.Sprint(out["balance"]) == "42"
	})

	password, err := os.ReadFile(lookup(senv, "SURGE_KAFKA_SASL_PASSWORD_FILE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		s.mu.Lock()
		log := s.log.String()
		s.mu.Unlock()
		if strings.Contains(log, string(password)) {
			t.Errorf("%s logged the SASL password", s.name)
		}
	}
}

// A service given a wrong password or an untrusted CA stops within
// seconds and says why, instead of retrying in silence; the password
// never shows in its output, its help or `surge config`.
func TestServiceRefusesWrongCredentials(t *testing.T) {
	t.Parallel()
	senv, _ := securedCluster(t)
	wrong := append(without(senv, "SURGE_KAFKA_SASL_PASSWORD_FILE"), "SURGE_KAFKA_SASL_PASSWORD=hunter2-wrong", "TMPDIR="+t.TempDir())
	out, code := runToEnd(t, wrong, "run", "push-presence", "--push.dir="+t.TempDir(), "--metrics.addr=")
	if code == 0 || !strings.Contains(out, "authentication refused") {
		t.Fatalf("wrong password: exit %d, output:\n%s\nwant a non-zero exit naming the refused authentication", code, out)
	}
	if strings.Contains(out, "hunter2-wrong") {
		t.Fatalf("the password is in the output:\n%s", out)
	}
	untrusted := append(without(senv, "SURGE_KAFKA_TLS_CA_FILE"), "SURGE_KAFKA_TLS_ENABLED=true", "TMPDIR="+t.TempDir())
	out, code = runToEnd(t, untrusted, "run", "push-presence", "--push.dir="+t.TempDir(), "--metrics.addr=")
	if code == 0 || !strings.Contains(out, "not signed by a trusted CA") {
		t.Fatalf("untrusted CA: exit %d, output:\n%s\nwant a non-zero exit naming the certificate", code, out)
	}

	out, _ = runToEnd(t, wrong, "config")
	if strings.Contains(out, "hunter2-wrong") || !strings.Contains(out, "(set, not shown)") {
		t.Fatalf("surge config shows the password or not that it is set:\n%s", out)
	}
	out, _ = runToEnd(t, nil, "run", "--help")
	if strings.Contains(out, "--kafka.sasl.password ") {
		t.Fatalf("surge run --help offers the password as a flag:\n%s", out)
	}
	if !strings.Contains(out, "--kafka.sasl.password_file") {
		t.Fatalf("surge run --help does not offer the password file:\n%s", out)
	}
}

// runToEnd runs surge with args to its end (at most a minute) and returns
// its combined output and exit code.
func runToEnd(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("surge %v did not end within a minute:\n%s", args, out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func without(env []string, key string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}

func lookup(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

func dedupe(topics []schemas.Topic) []schemas.Topic {
	seen := map[string]bool{}
	var out []schemas.Topic
	for _, t := range topics {
		if !seen[t.Name] {
			seen[t.Name] = true
			out = append(out, t)
		}
	}
	return out
}
