package main

import (
	"os"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
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
		"push-executor-1", "push-executor-2", "push-offline"} {
		if _, ok := f.Services[s]; !ok {
			t.Errorf("service %s missing", s)
		}
	}
	ran := 0
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
		case "wallet":
			if s.Env["SURGE_REDIS_ADDR"] == "" {
				t.Errorf("%s: the wallet needs redis", name)
			}
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
			ran++
		default:
			t.Errorf("%s: unknown surge command %q", name, s.Command[0])
		}
	}
	if ran != len(components) {
		t.Errorf("compose runs %d components, the binary has %d", ran, len(components))
	}
}
