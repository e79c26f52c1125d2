package deploy

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "write deploy/k8s/surge.yaml from docker-compose.yml")

const manifests = "k8s/surge.yaml"

// secretName: the environment keys that hold secrets.
var secretName = regexp.MustCompile(`(PASSWORD|SECRET|SEED|_APP_KEYS|_USER_KEYS|_POOL_KEYS|_RECON_KEYS)$`)

// TestManifestsAreRenderedFromCompose: deploy/k8s/surge.yaml is what
// docker-compose.yml renders to (regenerate with -update).
func TestManifestsAreRenderedFromCompose(t *testing.T) {
	compose, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Render(compose)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(manifests, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what docker-compose.yml renders to: go test ./deploy -update", manifests)
	}
}

// TestManifestsAreWellFormed reads every manifest back and checks the
// shape a platform needs: each has a kind and a name; each StatefulSet
// selects its own pods, probes /readyz and /healthz on its metrics port,
// runs as the image's user with its state on a claim, and has a headless
// Service and a PodDisruptionBudget; every secret comes from the Secret
// "surge" and no value holds one; every compose service is in.
func TestManifestsAreWellFormed(t *testing.T) {
	f, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	type object = map[string]any
	byKind := map[string]map[string]object{}
	dec := yaml.NewDecoder(bytes.NewReader(f))
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		kind, _ := o["kind"].(string)
		name, _ := dig(o, "metadata", "name").(string)
		if kind == "" || name == "" || o["apiVersion"] == nil {
			t.Fatalf("a manifest without apiVersion, kind or name: %v", o)
		}
		if byKind[kind] == nil {
			byKind[kind] = map[string]object{}
		}
		if byKind[kind][name] != nil {
			t.Fatalf("two %s named %s", kind, name)
		}
		byKind[kind][name] = o
	}
	secrets := 0
	for name, ss := range byKind["StatefulSet"] {
		sel := dig(ss, "spec", "selector", "matchLabels").(object)
		podLabels := dig(ss, "spec", "template", "metadata", "labels").(object)
		for k, v := range sel {
			if podLabels[k] != v {
				t.Errorf("%s: selector %s=%v does not select its pods (%v)", name, k, v, podLabels)
			}
		}
		if dig(ss, "spec", "serviceName") != name || byKind["Service"][name] == nil || dig(byKind["Service"][name], "spec", "clusterIP") != "None" {
			t.Errorf("%s: no headless Service of its name", name)
		}
		if p := byKind["PodDisruptionBudget"][name]; p == nil || dig(p, "spec", "maxUnavailable") != 1 {
			t.Errorf("%s: no PodDisruptionBudget allowing one pod down", name)
		}
		pod := dig(ss, "spec", "template", "spec").(object)
		if dig(pod, "securityContext", "runAsUser") != 65534 || dig(pod, "securityContext", "fsGroup") != 65534 {
			t.Errorf("%s: not run as the image's user 65534 with its volumes writable", name)
		}
		c := pod["containers"].([]any)[0].(object)
		if dig(c, "readinessProbe", "httpGet", "path") != "/readyz" || dig(c, "livenessProbe", "httpGet", "path") != "/healthz" {
			t.Errorf("%s: probes %v %v", name, c["readinessProbe"], c["livenessProbe"])
		}
		mounted := false
		for _, m := range c["volumeMounts"].([]any) {
			mounted = mounted || m.(object)["mountPath"] == "/var/lib/surge" && m.(object)["name"] == "state"
		}
		if !mounted || dig(ss, "spec", "volumeClaimTemplates") == nil {
			t.Errorf("%s: /var/lib/surge is not on a volume claim", name)
		}
		for _, e := range c["env"].([]any) {
			e := e.(object)
			n := e["name"].(string)
			if ref := dig(e, "valueFrom", "secretKeyRef"); ref != nil {
				secrets++
				if ref.(object)["name"] != "surge" {
					t.Errorf("%s: %s from secret %v", name, n, ref)
				}
			}
			if v, _ := e["value"].(string); strings.Contains(v, "${") || secretName.MatchString(n) && v != "" {
				t.Errorf("%s: %s=%q is written in the manifest (a secret, or compose syntax)", name, n, v)
			}
			if n == "SURGE_PROCESSOR_INSTANCE_ID" && e["value"] != "$(POD_NAME)" {
				t.Errorf("%s: instance id %v is not the pod's stable name", name, e["value"])
			}
		}
	}
	if secrets == 0 {
		t.Fatal("no secret is taken from the Secret")
	}
	compose, _ := os.ReadFile("../docker-compose.yml")
	var cf composeFile
	if err := yaml.Unmarshal(compose, &cf); err != nil {
		t.Fatal(err)
	}
	for svc, s := range cf.Services {
		if s.Image != image {
			continue
		}
		base := replicaSuffix.ReplaceAllString(svc, "")
		if byKind["StatefulSet"][base] == nil && byKind["Job"][base] == nil && byKind["CronJob"][base] == nil {
			t.Errorf("compose service %s has no workload", svc)
		}
	}
	if ss := byKind["StatefulSet"]["push-planner"]; ss == nil || dig(ss, "spec", "replicas") != 2 {
		t.Errorf("push-planner: want 2 replicas (an active one and a standby)")
	}
}

// dig walks nested maps.
func dig(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}
