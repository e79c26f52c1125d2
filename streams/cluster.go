package streams

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// Cluster is how to reach one Kafka cluster: its seed brokers and the
// connection's security. Every Kafka client of the product (processors,
// admin, replay, tables, commands, benches) is made by Cluster.NewClient,
// so a deployment's TLS and SASL settings reach all of them.
type Cluster struct {
	Seeds []string
	// TLS encrypts every connection when set (nil: plaintext).
	TLS *tls.Config
	// SASL authenticates every connection when set (nil: none).
	SASL sasl.Mechanism
}

// Seeds is a plaintext, unauthenticated cluster: the embedded broker and
// the tests' brokers.
func Seeds(addrs ...string) Cluster { return Cluster{Seeds: addrs} }

// Opts are the client options that reach the cluster, then extra. Writes
// wait for every in-sync replica (acks=all, franz-go's default, stated so
// no later option weakens it unnoticed): with min.insync.replicas below the
// replication factor, an acknowledged record survives a broker's death.
func (c Cluster) Opts(extra ...kgo.Opt) []kgo.Opt {
	opts := make([]kgo.Opt, 0, 4+len(extra))
	opts = append(opts, kgo.SeedBrokers(c.Seeds...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if c.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.TLS.Clone()))
	}
	if c.SASL != nil {
		opts = append(opts, kgo.SASL(c.SASL))
	}
	return append(opts, extra...)
}

// NewClient is kgo.NewClient with the cluster's options, then extra.
func (c Cluster) NewClient(extra ...kgo.Opt) (*kgo.Client, error) {
	if len(c.Seeds) == 0 {
		return nil, errors.New("streams: no Kafka seed brokers")
	}
	return kgo.NewClient(c.Opts(extra...)...)
}

// String names the cluster without secrets: seeds, tls, SASL mechanism.
func (c Cluster) String() string {
	s := strings.Join(c.Seeds, ",")
	if c.TLS != nil {
		s += " tls"
	}
	if c.SASL != nil {
		s += " sasl=" + c.SASL.Name()
	}
	return s
}

// Check connects once to the cluster within timeout and says plainly why
// it could not: a refused password or an untrusted certificate is an
// operator's mistake that no retry mends, so a service checks before it
// starts instead of retrying in silence.
func (c Cluster) Check(ctx context.Context, timeout time.Duration) error {
	cl, err := c.NewClient(kgo.RequestRetries(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	closedAtOnce := 0
	for {
		err = cl.Ping(ctx)
		if err == nil {
			return nil
		}
		if why := c.permanent(err); why != "" {
			return fmt.Errorf("kafka %s: %s: %w", c, why, err)
		}
		// A listener that wants TLS or SASL the client does not speak
		// closes the connection at once; so may a broker shutting down,
		// once. franz-go's message says which it guesses.
		var firstRead *kgo.ErrFirstReadEOF
		if errors.As(err, &firstRead) {
			if closedAtOnce++; closedAtOnce == 3 {
				return fmt.Errorf("kafka %s: the broker closes every connection at once (kafka.tls.* or kafka.sasl.* do not match its listener): %w", c, err)
			}
		} else {
			closedAtOnce = 0
		}
		// A broker still starting refuses connections: try again until
		// the timeout, then say what the last attempt met.
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka %s: not reachable within %s: %w", c, timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// permanent says what a connection error means when retrying cannot help.
func (c Cluster) permanent(err error) string {
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return "authentication refused (check kafka.sasl.username and its password)"
	case errors.Is(err, kerr.UnsupportedSaslMechanism), errors.Is(err, kerr.IllegalSaslState):
		return "the broker does not take SASL mechanism " + c.mechanism() + " on this listener"
	case errors.As(err, &unknownAuthority):
		return "the broker's certificate is not signed by a trusted CA (set kafka.tls.ca_file)"
	case errors.As(err, &hostname):
		return "the broker's certificate does not name this host (set kafka.tls.server_name)"
	case errors.As(err, &invalid):
		return "the broker's certificate is not valid"
	case errors.As(err, &record):
		return "the listener does not speak TLS (is kafka.tls.enabled meant for this port?)"
	case errors.As(err, &alert):
		return "the broker refused the TLS handshake (a client certificate it trusts may be needed)"
	}
	// franz-go names these only in its message.
	switch msg := err.Error(); {
	case strings.Contains(msg, "plaintext connection speaking to a tls endpoint"):
		return "the listener speaks TLS (set kafka.tls.enabled or kafka.tls.ca_file)"
	case strings.Contains(msg, "beginning of an HTTP response"):
		return "an HTTP server answers, not a Kafka broker (check the port)"
	}
	return ""
}

func (c Cluster) mechanism() string {
	if c.SASL == nil {
		return "(none)"
	}
	return c.SASL.Name()
}
