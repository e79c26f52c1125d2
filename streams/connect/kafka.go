package connect

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"surge/streams"
)

// KafkaKeys are the configuration keys Kafka reads, for the commands'
// option table and documentation; the secret is the password.
var KafkaKeys = struct{ Brokers, Mechanism, Username, Password string }{
	"kafka.brokers", "kafka.sasl.mechanism", "kafka.sasl.username", "kafka.sasl.password",
}

// Kafka reads the cluster: kafka.brokers, kafka.tls.* (TLS) and
// kafka.sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) with
// kafka.sasl.username and kafka.sasl.password (or _file).
func Kafka(get Getter) (streams.Cluster, error) {
	c := streams.Cluster{Seeds: List(get, KafkaKeys.Brokers)}
	var err error
	if c.TLS, err = TLS(get, "kafka"); err != nil {
		return streams.Cluster{}, err
	}
	if c.SASL, err = kafkaSASL(get); err != nil {
		return streams.Cluster{}, err
	}
	return c, nil
}

func kafkaSASL(get Getter) (sasl.Mechanism, error) {
	mech := strings.ToUpper(strings.TrimSpace(get(KafkaKeys.Mechanism)))
	user := get(KafkaKeys.Username)
	pass, err := Secret(get, KafkaKeys.Password)
	if err != nil {
		return nil, err
	}
	if mech == "" {
		if user != "" || pass != "" {
			return nil, fmt.Errorf("%s is set but %s is not (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", KafkaKeys.Username, KafkaKeys.Mechanism)
		}
		return nil, nil
	}
	if user == "" || pass == "" {
		return nil, fmt.Errorf("%s %s needs %s and %s (or %s_file)", KafkaKeys.Mechanism, mech, KafkaKeys.Username, KafkaKeys.Password, KafkaKeys.Password)
	}
	switch mech {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("%s: %q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", KafkaKeys.Mechanism, mech)
}
