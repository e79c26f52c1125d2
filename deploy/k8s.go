// Package deploy renders the Kubernetes manifests of deploy/k8s from
// docker-compose.yml, so the two deployments cannot drift apart: every
// surge service of the compose file becomes a StatefulSet (stable pod
// names are the instance ids static group membership needs), with a
// headless Service, readiness and liveness probes, a PodDisruptionBudget
// and a volume claim for its local state; secrets come from the Secret
// "surge", the endpoints of Kafka, Redis and ClickHouse from the ConfigMap
// "surge"; the topics job is a Job and the stock classification a CronJob.
// `go test ./deploy -update` writes deploy/k8s/surge.yaml again.
package deploy

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// composeFile is the part of docker-compose.yml the manifests need.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	MemLimit    string            `yaml:"mem_limit"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	Profiles []string `yaml:"profiles"`
}

// workload is one StatefulSet (or Job): compose services name-1, name-2
// are its replicas.
type workload struct {
	name     string
	replicas int
	svc      composeService
}

var (
	replicaSuffix = regexp.MustCompile(`-[0-9]+$`)
	required      = regexp.MustCompile(`^\$\{([A-Z0-9_]+):\?.*\}$`)
	defaulted     = regexp.MustCompile(`^\$\{([A-Z0-9_]+):-(.*)\}$`)
)

// The servers' compose host names, which the ConfigMap maps to the
// platform's endpoints.
var endpointKeys = map[string]bool{"SURGE_KAFKA_BROKERS": true, "SURGE_REDIS_ADDR": true, "SURGE_CLICKHOUSE_DSN": true, "SURGE_CLICKHOUSE_USERNAME": true}

const (
	metricsPort = 9464
	stateDir    = "/var/lib/surge"
	image       = "surge:latest"
)

// Render returns the manifests for the compose file's surge services.
func Render(compose []byte) ([]byte, error) {
	var cf composeFile
	if err := yaml.Unmarshal(compose, &cf); err != nil {
		return nil, fmt.Errorf("deploy: docker-compose.yml: %w", err)
	}
	byName := map[string]*workload{}
	config := map[string]string{}
	for name, svc := range cf.Services {
		if svc.Image != image {
			continue // Kafka, Redis and ClickHouse: the platform's own
		}
		base := replicaSuffix.ReplaceAllString(name, "")
		if w := byName[base]; w != nil {
			w.replicas++
			continue
		}
		byName[base] = &workload{name: base, replicas: 1, svc: svc}
		for k, v := range svc.Environment {
			if endpointKeys[k] {
				config[k] = v
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)

	var docs []any
	docs = append(docs, doc("v1", "ConfigMap", "surge", map[string]any{
		"data": config,
	}, "Where Kafka, Redis and ClickHouse are: edit for the platform's endpoints (TLS and SASL keys: docs/operations.md)."))
	for _, n := range names {
		w := byName[n]
		switch {
		case len(w.svc.Command) > 0 && w.svc.Command[0] == "topics":
			docs = append(docs, job(w))
		case contains(w.svc.Profiles, "jobs"):
			docs = append(docs, cronJob(w))
		default:
			docs = append(docs, headless(w), statefulSet(w), pdb(w))
			if len(w.svc.Ports) > 0 {
				docs = append(docs, apiService(w))
			}
		}
	}
	var out bytes.Buffer
	out.WriteString("# Generated from docker-compose.yml by `go test ./deploy -update`; do not edit.\n")
	out.WriteString("# Needs: the Secret \"surge\" (keys listed in docs/operations.md, \"Kubernetes\"),\n")
	out.WriteString("# the image surge:latest in the cluster's registry, Kafka, Redis and ClickHouse.\n")
	for _, d := range docs {
		out.WriteString("---\n")
		enc := yaml.NewEncoder(&out)
		enc.SetIndent(2)
		if err := enc.Encode(d); err != nil {
			return nil, err
		}
		_ = enc.Close()
	}
	return out.Bytes(), nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// doc is a manifest with its head; spec holds the rest of its fields.
func doc(apiVersion, kind, name string, rest map[string]any, comment string) *yaml.Node {
	m := map[string]any{"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": name, "labels": labels(name)}}
	for k, v := range rest {
		m[k] = v
	}
	var n yaml.Node
	_ = n.Encode(m)
	n.HeadComment = comment
	return &n
}

func labels(name string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "surge"}
}

// env is a service's environment: endpoints from the ConfigMap, secrets
// from the Secret, the instance id and executor name from the pod's name.
func env(w workload) []map[string]any {
	out := []map[string]any{{"name": "POD_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "metadata.name"}}}}
	keys := make([]string, 0, len(w.svc.Environment))
	for k := range w.svc.Environment {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := w.svc.Environment[k]
		e := map[string]any{"name": k}
		switch {
		case endpointKeys[k]:
			e["valueFrom"] = map[string]any{"configMapKeyRef": map[string]any{"name": "surge", "key": k}}
		case required.MatchString(v):
			e["valueFrom"] = map[string]any{"secretKeyRef": map[string]any{"name": "surge", "key": required.FindStringSubmatch(v)[1]}}
		case k == "SURGE_PROCESSOR_INSTANCE_ID", k == "SURGE_PUSH_EXECUTOR_NAME":
			e["value"] = "$(POD_NAME)" // stable across restarts: static membership, own queue
		case k == "SURGE_WALLET_ADVERTISE":
			e["value"] = fmt.Sprintf("http://$(POD_NAME).%s:%s", w.name, containerPort(w.svc.Ports[0]))
		case defaulted.MatchString(v):
			e["value"] = defaulted.FindStringSubmatch(v)[2]
		default:
			e["value"] = v
		}
		out = append(out, e)
	}
	return out
}

// containerPort is the container side of a compose "host:container" port.
func containerPort(p string) string {
	_, c, ok := strings.Cut(p, ":")
	if !ok {
		return p
	}
	return c
}

func container(w workload) map[string]any {
	ports := []map[string]any{{"name": "metrics", "containerPort": metricsPort}}
	for i, p := range w.svc.Ports {
		n, _ := strconv.Atoi(containerPort(p))
		if n == metricsPort {
			continue
		}
		ports = append(ports, map[string]any{"name": fmt.Sprintf("api%d", i), "containerPort": n})
	}
	c := map[string]any{
		"name": "surge", "image": image, "args": w.svc.Command, "env": env(w), "ports": ports,
		"volumeMounts": []map[string]any{{"name": "state", "mountPath": stateDir}, {"name": "tmp", "mountPath": "/tmp"}},
		// Ready once it has joined its groups and its brokers and Redis
		// answer (docs/operations.md, "Readiness").
		"readinessProbe": map[string]any{"httpGet": map[string]any{"path": "/readyz", "port": "metrics"}, "periodSeconds": 5, "failureThreshold": 3},
		"livenessProbe":  map[string]any{"httpGet": map[string]any{"path": "/healthz", "port": "metrics"}, "periodSeconds": 10, "failureThreshold": 6, "initialDelaySeconds": 10},
		"securityContext": map[string]any{"runAsNonRoot": true, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
			"capabilities": map[string]any{"drop": []string{"ALL"}}},
	}
	if w.svc.MemLimit != "" {
		c["resources"] = map[string]any{"limits": map[string]any{"memory": k8sQuantity(w.svc.MemLimit)}}
	}
	return c
}

// k8sQuantity turns compose's "2g" into Kubernetes' "2Gi".
func k8sQuantity(q string) string {
	if d := defaulted.FindStringSubmatch(q); d != nil {
		q = d[2]
	}
	q = strings.ToLower(q)
	for _, u := range []string{"k", "m", "g"} {
		if strings.HasSuffix(q, u) {
			return strings.TrimSuffix(q, u) + strings.ToUpper(u) + "i"
		}
	}
	return q
}

func podSpec(w workload) map[string]any {
	return map[string]any{
		"securityContext":               map[string]any{"runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534},
		"terminationGracePeriodSeconds": 30, // a graceful stop leaves the group at once
		"containers":                    []any{container(w)},
		"volumes":                       []any{map[string]any{"name": "tmp", "emptyDir": map[string]any{}}},
	}
}

func statefulSet(w *workload) *yaml.Node {
	return doc("apps/v1", "StatefulSet", w.name, map[string]any{"spec": map[string]any{
		"serviceName":         w.name,
		"replicas":            w.replicas,
		"podManagementPolicy": "Parallel",
		"selector":            map[string]any{"matchLabels": labels(w.name)},
		"template": map[string]any{
			"metadata": map[string]any{"labels": labels(w.name)},
			"spec":     podSpec(*w),
		},
		// Local state is a cache rebuilt from topics: a small disk that
		// survives restarts so a restart does not replay everything.
		"volumeClaimTemplates": []any{map[string]any{
			"metadata": map[string]any{"name": "state"},
			"spec": map[string]any{"accessModes": []string{"ReadWriteOnce"},
				"resources": map[string]any{"requests": map[string]any{"storage": "10Gi"}}},
		}},
	}}, "")
}

func headless(w *workload) *yaml.Node {
	return doc("v1", "Service", w.name, map[string]any{"spec": map[string]any{
		"clusterIP": "None", "selector": labels(w.name),
		"ports": []any{map[string]any{"name": "metrics", "port": metricsPort}},
	}}, fmt.Sprintf("%s: %d replica(s); each pod's name is its instance id.", w.name, w.replicas))
}

func apiService(w *workload) *yaml.Node {
	p, _ := strconv.Atoi(containerPort(w.svc.Ports[0]))
	return doc("v1", "Service", w.name+"-api", map[string]any{"spec": map[string]any{
		"selector": labels(w.name),
		"ports":    []any{map[string]any{"name": "api", "port": p, "targetPort": p}},
	}}, "")
}

func pdb(w *workload) *yaml.Node {
	return doc("policy/v1", "PodDisruptionBudget", w.name, map[string]any{"spec": map[string]any{
		"maxUnavailable": 1, "selector": map[string]any{"matchLabels": labels(w.name)},
	}}, "")
}

// batchPod is the pod of a Job or CronJob: no probes (it ends), restarted
// on failure; mounts replace the container's, volumes the pod's.
func batchPod(w *workload, mounts []map[string]any, volumes []any) map[string]any {
	spec := podSpec(*w)
	c := container(*w)
	delete(c, "readinessProbe")
	delete(c, "livenessProbe")
	if mounts != nil {
		c["volumeMounts"] = mounts
	}
	if volumes != nil {
		spec["volumes"] = volumes
	}
	spec["containers"] = []any{c}
	spec["restartPolicy"] = "OnFailure"
	return spec
}

func job(w *workload) *yaml.Node {
	spec := batchPod(w, []map[string]any{{"name": "tmp", "mountPath": "/tmp"}}, nil)
	return doc("batch/v1", "Job", w.name, map[string]any{"spec": map[string]any{
		"backoffLimit": 10,
		"template":     map[string]any{"metadata": map[string]any{"labels": labels(w.name)}, "spec": spec},
	}}, "Creates the topics (idempotent): run before the services, and again after an upgrade.")
}

func cronJob(w *workload) *yaml.Node {
	spec := batchPod(w, nil, []any{map[string]any{"name": "state", "emptyDir": map[string]any{}}, map[string]any{"name": "tmp", "emptyDir": map[string]any{}}})
	return doc("batch/v1", "CronJob", w.name, map[string]any{"spec": map[string]any{
		"schedule":          "30 3 * * *",
		"concurrencyPolicy": "Forbid", // a re-run is harmless (idempotent per registration), two at once pointless
		"jobTemplate": map[string]any{"spec": map[string]any{"backoffLimit": 3,
			"template": map[string]any{"metadata": map[string]any{"labels": labels(w.name)}, "spec": spec}}},
	}}, "The stock classification, daily.")
}
