package connect_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"surge/schemas"
	"surge/streams"
	"surge/streams/connect"
	"surge/streams/streamstest"
)

func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(out, kv[i])
		} else {
			out[kv[i]] = kv[i+1]
		}
	}
	return out
}

// checkErr is what Check says for env; a generous timeout, so an error
// naming the cause (not "not reachable within") shows it did not wait.
func checkErr(t *testing.T, env map[string]string) error {
	t.Helper()
	kc, err := connect.Kafka(connect.Vars(env))
	if err != nil {
		t.Fatal(err)
	}
	return kc.Check(context.Background(), time.Minute)
}

func TestSecuredListenerEveryMechanism(t *testing.T) {
	t.Parallel()
	env := streamstest.Secured(t)
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			kc, err := connect.Kafka(connect.Vars(with(env, "SURGE_KAFKA_SASL_MECHANISM", mech)))
			if err != nil {
				t.Fatal(err)
			}
			if kc.TLS == nil || kc.SASL == nil || kc.SASL.Name() != mech {
				t.Fatalf("cluster %s: want TLS and SASL %s", kc, mech)
			}
			if err := kc.Check(context.Background(), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			// A record makes the round trip over the secured listener.
			topic := streamstest.Unique("secure-" + strings.ToLower(mech))
			streamstest.CreateTopics(t, kc, 1, topic)
			cl := streamstest.Client(t, kc)
			streamstest.ProduceSync(t, cl, &kgo.Record{Topic: topic, Value: []byte(mech)})
			got := streamstest.ReadN(t, kc, topic, true, 1, 30*time.Second, 0)
			if len(got) != 1 || string(got[0].Value) != mech {
				t.Fatalf("read %d records back, want the one produced", len(got))
			}
		})
	}
}

func TestWrongPasswordIsRefusedWithTheReason(t *testing.T) {
	t.Parallel()
	env := streamstest.Secured(t)
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-512"} {
		err := checkErr(t, with(env, "SURGE_KAFKA_SASL_MECHANISM", mech,
			"SURGE_KAFKA_SASL_PASSWORD_FILE", "", "SURGE_KAFKA_SASL_PASSWORD", "not-the-password"))
		if err == nil || !strings.Contains(err.Error(), "authentication refused") {
			t.Fatalf("%s with a wrong password: %v, want an authentication refusal", mech, err)
		}
		if strings.Contains(err.Error(), "not-the-password") {
			t.Fatalf("the error shows the password: %v", err)
		}
	}
	err := checkErr(t, with(env, "SURGE_KAFKA_SASL_USERNAME", "nobody"))
	if err == nil || !strings.Contains(err.Error(), "authentication refused") {
		t.Fatalf("unknown user: %v, want an authentication refusal", err)
	}
}

func TestUntrustedCertificateIsRefusedWithTheReason(t *testing.T) {
	t.Parallel()
	env := streamstest.Secured(t)
	other := filepath.Join(t.TempDir(), "other-ca.crt")
	writeSelfSignedCA(t, other)
	err := checkErr(t, with(env, "SURGE_KAFKA_TLS_CA_FILE", other))
	if err == nil || !strings.Contains(err.Error(), "not signed by a trusted CA") {
		t.Fatalf("broker certificate from another CA: %v, want it refused as untrusted", err)
	}
	// The system's roots do not know the test CA either.
	err = checkErr(t, with(env, "SURGE_KAFKA_TLS_CA_FILE", "", "SURGE_KAFKA_TLS_ENABLED", "true"))
	if err == nil || !strings.Contains(err.Error(), "not signed by a trusted CA") {
		t.Fatalf("system roots: %v, want the certificate refused as untrusted", err)
	}
	// Skipping verification is possible, only by its name.
	if err := checkErr(t, with(env, "SURGE_KAFKA_TLS_CA_FILE", "", "SURGE_KAFKA_TLS_INSECURE_SKIP_VERIFY", "true")); err != nil {
		t.Fatalf("insecure_skip_verify: %v", err)
	}
}

func TestPlaintextClientOnSecuredListener(t *testing.T) {
	t.Parallel()
	env := streamstest.Secured(t)
	err := checkErr(t, map[string]string{"SURGE_KAFKA_BROKERS": env["SURGE_KAFKA_BROKERS"]})
	if err == nil {
		t.Fatal("a plaintext client got through a SASL_SSL listener")
	}
	if strings.Contains(err.Error(), "not reachable within") {
		t.Fatalf("a plaintext client waited out the timeout instead of saying why: %v", err)
	}
	// TLS without SASL: the handshake works, the broker then closes.
	err = checkErr(t, with(env, "SURGE_KAFKA_SASL_MECHANISM", "", "SURGE_KAFKA_SASL_USERNAME", "", "SURGE_KAFKA_SASL_PASSWORD_FILE", ""))
	if err == nil || strings.Contains(err.Error(), "not reachable within") {
		t.Fatalf("TLS without SASL: %v, want a refusal with its reason", err)
	}
}

func TestKafkaConfigMistakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"SURGE_KAFKA_BROKERS": "b1:9092, b2:9092"}
	for _, c := range []struct {
		name string
		env  map[string]string
		want string // in the error; "" is no error
	}{
		{"plain", base, ""},
		{"scram from file", with(base, "SURGE_KAFKA_SASL_MECHANISM", "scram-sha-512", "SURGE_KAFKA_SASL_USERNAME", "u", "SURGE_KAFKA_SASL_PASSWORD_FILE", pw), ""},
		{"unknown mechanism", with(base, "SURGE_KAFKA_SASL_MECHANISM", "GSSAPI", "SURGE_KAFKA_SASL_USERNAME", "u", "SURGE_KAFKA_SASL_PASSWORD", "p"), "is not PLAIN"},
		{"user without mechanism", with(base, "SURGE_KAFKA_SASL_USERNAME", "u"), "kafka.sasl.mechanism is not"},
		{"mechanism without password", with(base, "SURGE_KAFKA_SASL_MECHANISM", "PLAIN", "SURGE_KAFKA_SASL_USERNAME", "u"), "needs kafka.sasl.username and kafka.sasl.password"},
		{"password twice", with(base, "SURGE_KAFKA_SASL_MECHANISM", "PLAIN", "SURGE_KAFKA_SASL_USERNAME", "u", "SURGE_KAFKA_SASL_PASSWORD", "p", "SURGE_KAFKA_SASL_PASSWORD_FILE", pw), "both set"},
		{"missing password file", with(base, "SURGE_KAFKA_SASL_MECHANISM", "PLAIN", "SURGE_KAFKA_SASL_USERNAME", "u", "SURGE_KAFKA_SASL_PASSWORD_FILE", pw+".nope"), "kafka.sasl.password_file"},
		{"certificate without key", with(base, "SURGE_KAFKA_TLS_CERT_FILE", pw), "go together"},
		{"CA file without PEM", with(base, "SURGE_KAFKA_TLS_CA_FILE", pw), "no PEM certificate"},
		{"bool nonsense", with(base, "SURGE_KAFKA_TLS_ENABLED", "yes please"), "not true or false"},
	} {
		kc, err := connect.Kafka(connect.Vars(c.env))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.want)
		case c.want == "" && len(kc.Seeds) != 2:
			t.Errorf("%s: seeds %v, want two", c.name, kc.Seeds)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: the error shows the password: %v", c.name, err)
		}
		if strings.Contains(kc.String(), "s3cret") {
			t.Errorf("%s: the cluster's name shows the password: %s", c.name, kc)
		}
	}
}

func TestReplicationResolvesFromTheCluster(t *testing.T) {
	streamstest.Each(t, func(t *testing.T, b streamstest.Backend) {
		cl := streamstest.Client(t, b.Kafka)
		ctx := context.Background()
		rep, err := streams.Replication{}.Resolve(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		if rep != streams.OneCopy { // both test brokers are one node
			t.Fatalf("one broker: resolved %+v, want %+v", rep, streams.OneCopy)
		}
		if _, err := (streams.Replication{Factor: 1, MinInsync: 2}).Resolve(ctx, cl); err == nil {
			t.Fatal("min.insync.replicas above the factor was accepted")
		}
		topic := streamstest.Unique("rep")
		if err := streams.EnsureTopics(ctx, cl, streams.Replication{}, schemas.Topic{Name: topic, Partitions: 1, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if !b.Real {
			return
		}
		// The real broker keeps the topic's min.insync.replicas as set.
		got := topicConfig(t, cl, topic, "min.insync.replicas")
		if got != "1" {
			t.Fatalf("min.insync.replicas = %q, want 1", got)
		}
	})
}

func writeSelfSignedCA(t *testing.T, path string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func topicConfig(t *testing.T, cl *kgo.Client, topic, key string) string {
	t.Helper()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}
