package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"surge/cmd/surge/topology"
)

// docker-compose.yml parses (anchors and merge keys resolved), has the
// servers the product needs, and every surge service runs a command and
// component that this binary has.
func TestComposeFileParsesAndNamesRealComponents(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Image   string         `yaml:"image"`
			Command []string       `yaml:"command"`
			Env     map[string]any `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	for _, s := range []string{"kafka", "redis", "clickhouse", "topics", "push-planner-1", "push-planner-2",
		"push-executor-1", "push-executor-2", "push-offline", "push-timers", "uin-tracker", "uin-recycle-1", "uin-recycle-2",
		"uin-timers", "uin-pool-1", "uin-pool-2"} {
		if _, ok := f.Services[s]; !ok {
			t.Errorf("service %s missing", s)
		}
	}
	ran := map[string]bool{}
	for name, s := range f.Services {
		if s.Image != "surge:latest" {
			continue
		}
		if len(s.Command) == 0 {
			t.Errorf("%s: no command", name)
			continue
		}
		switch s.Command[0] {
		case "topics":
		case "uin":
			if len(s.Command) < 2 || s.Command[1] != "run" && s.Command[1] != "classify" {
				t.Errorf("%s: uin must run or classify, not %v", name, s.Command)
			}
			if s.Env["SURGE_REDIS_ADDR"] == "" {
				t.Errorf("%s: uin recycling needs redis (accounts, pool)", name)
			}
		case "recon":
			if len(s.Command) != 2 || s.Command[1] != "serve" {
				t.Errorf("%s: recon must serve, not %v", name, s.Command)
			}
		case "run":
			if len(s.Command) != 2 || !slices.Contains(components, s.Command[1]) {
				t.Errorf("%s: runs %v, not one of %v", name, s.Command, components)
			}
			if s.Env["SURGE_KAFKA_BROKERS"] != "kafka:9092" {
				t.Errorf("%s: brokers not set from the anchor: %v", name, s.Env)
			}
			ran[s.Command[1]] = true
			if s.Command[1] == "wallet" {
				checkWalletService(t, name, s.Env)
			}
		default:
			t.Errorf("%s: unknown surge command %q", name, s.Command[0])
		}
	}
	// Not in compose, by design: push-presence is presence under a push
	// namespace (load tests).
	for _, c := range components {
		if !ran[c] && c != "push-presence" {
			t.Errorf("component %s runs in no compose service", c)
		}
	}
}

// Every component `surge run` starts has a declared spec in the topology
// (push-presence is presence behind push.namespace).
func TestEveryComponentIsDeclared(t *testing.T) {
	declared := map[string]bool{}
	for _, s := range topology.Processors() {
		declared[s.Name] = true
	}
	for _, name := range components {
		names := []string{name}
		switch name {
		case "push-presence":
			names = []string{"presence"}
		case "wallet":
			names = []string{"wallet-api", "wallet-ledger"}
		}
		for _, n := range names {
			if !declared[n] {
				t.Errorf("surge run %s: no spec %s in processors/topology", name, n)
			}
		}
	}
}

// checkWalletService checks a wallet service's environment.
func checkWalletService(t *testing.T, name string, env map[string]any) {
	t.Helper()
	if addr, _ := env["SURGE_REDIS_ADDR"].(string); addr == "" {
		t.Errorf("%s: the wallet needs redis", name)
	}
	// Keys from the deployer's environment, and required: never a
	// secret in this file, never a throw-away key per instance.
	if env["SURGE_WALLET_REQUIRE_KEYS"] != "true" {
		t.Errorf("%s: SURGE_WALLET_REQUIRE_KEYS must be \"true\"", name)
	}
	for _, k := range []string{"SURGE_WALLET_KEY_SEED", "SURGE_WALLET_APP_KEYS", "SURGE_WALLET_USER_KEYS"} {
		if want := "${" + k + ":?"; !strings.HasPrefix(fmt.Sprint(env[k]), want) {
			t.Errorf("%s: %s is %v, want %s...} (required, from the environment)", name, k, env[k], want)
		}
	}
}
