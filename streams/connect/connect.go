// Package connect turns configuration into connections to the servers a
// surge process talks to: the Kafka cluster (seeds, TLS, SASL) and Redis
// (single, cluster or sentinel; ACL user, password, TLS). Commands read
// their keys through viper, benches from the environment; both end here,
// so every client of a deployment is secured the same way.
//
// Secrets (passwords) are read from the environment or from a file named
// by the key's _file twin, never from flags, and never printed.
package connect

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Getter reads one configuration key ("kafka.sasl.username"); "" is unset.
type Getter func(key string) string

// Env reads key from the environment as SURGE_<KEY> (dots as _), as the
// commands do, for programs without a config file (benches).
func Env(key string) string { return os.Getenv(envName(key)) }

// Vars reads keys from a set of SURGE_* variables (a client.env file's),
// named as Env names them.
func Vars(vars map[string]string) Getter {
	return func(key string) string { return vars[envName(key)] }
}

// envName is key's variable: SURGE_ and the key in upper case, dots as _.
func envName(key string) string { return "SURGE_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_")) }

// Secret reads a secret key: its value, or the content of the file its
// _file twin names (trailing newline dropped), but not both.
func Secret(get Getter, key string) (string, error) {
	v, file := get(key), get(key+"_file")
	switch {
	case v != "" && file != "":
		return "", fmt.Errorf("%s and %s_file are both set: set one", key, key)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s_file: %w", key, err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	return v, nil
}

// Bool reads a boolean key; unset is false, nonsense an error.
func Bool(get Getter, key string) (bool, error) {
	v := get(key)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s: %q is not true or false", key, v)
	}
	return b, nil
}

// List splits a comma-separated key into its non-empty items.
func List(get Getter, key string) []string {
	var out []string
	for _, s := range strings.Split(get(key), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// TLS reads <prefix>.tls.*: enabled, ca_file (else the system's roots),
// cert_file and key_file (a client certificate), server_name, and
// insecure_skip_verify, which is honoured only by that name. It returns
// nil when TLS is not enabled (setting any file enables it).
func TLS(get Getter, prefix string) (*tls.Config, error) {
	p := prefix + ".tls."
	enabled, err := Bool(get, p+"enabled")
	if err != nil {
		return nil, err
	}
	skip, err := Bool(get, p+"insecure_skip_verify")
	if err != nil {
		return nil, err
	}
	ca, cert, key, name := get(p+"ca_file"), get(p+"cert_file"), get(p+"key_file"), get(p+"server_name")
	if !enabled && ca == "" && cert == "" && key == "" && name == "" && !skip {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name, InsecureSkipVerify: skip} //nolint:gosec // only when asked for by name
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%sca_file: %w", p, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%sca_file %s: no PEM certificate in it", p, ca)
		}
		cfg.RootCAs = pool
	}
	switch {
	case cert != "" && key != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%scert_file/key_file: %w", p, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case cert != "" || key != "":
		return nil, errors.New(p + "cert_file and key_file go together")
	}
	return cfg, nil
}
