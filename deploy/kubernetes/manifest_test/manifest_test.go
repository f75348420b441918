package manifest_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// What the binary is, as stated here: this module cannot import
// cmd/ratemesh. cmd/ratemesh's TestKubernetesConstants asserts the same
// values against the real flag set, config defaults and routes; change
// both together.
const (
	// defaultAPIPort is serve's default API port (node.api 127.0.0.1:8080);
	// dns: discovery asks every peer's API on the port its entry names,
	// so the manifests keep the default.
	defaultAPIPort = 8080
	// defaultMeshPort is the port of serve's default listen address
	// (/ip4/127.0.0.1/tcp/4001).
	defaultMeshPort = 4001
	// livePath and readyPath are the API's open probe endpoints.
	livePath  = "/livez"
	readyPath = "/readyz"
	// shutdownBudget bounds serve's exit after SIGTERM.
	shutdownBudget = 9 * time.Second
	// dnsPrefix starts a bootstrap entry found by DNS: dns:HOST:PORT.
	dnsPrefix = "dns:"
)

// serveFlags are serve's flags; boolFlags take no value.
var (
	serveFlags = []string{
		"allow-peer", "allow-peers-dns", "allow-peers-file", "api", "bootstrap", "client-ca", "config",
		"config-poll", "data-dir", "envoy-config", "envoy-share-wait", "grpc", "insecure-api", "listen", "log-format",
		"log-level", "metrics-auth", "pprof", "psk-file", "tls-cert", "tls-key", "token-file", "upgrade-alone",
	}
	boolFlags = []string{"insecure-api", "metrics-auth", "upgrade-alone"}
)

// manifests are the parsed files of deploy/kubernetes.
type manifests struct {
	sts        *appsv1.StatefulSet
	services   map[string]*corev1.Service
	configMaps map[string]*corev1.ConfigMap
	pdbs       []*policyv1.PodDisruptionBudget
}

// load decodes every document of every YAML file in deploy/kubernetes
// strictly (an unknown or misspelt field is an error) into its API type.
func load(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/kubernetes: %v", err)
	}
	m := &manifests{services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(data, []byte("\n---\n")) {
			where := fmt.Sprintf("%s document %d", filepath.Base(f), i)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 StatefulSet":
				if m.sts != nil {
					t.Fatalf("%s: a second StatefulSet", where)
				}
				m.sts = &appsv1.StatefulSet{}
				obj = m.sts
			case "v1 Service":
				s := &corev1.Service{}
				obj = s
				defer func() { m.services[s.Name] = s }()
			case "v1 ConfigMap":
				c := &corev1.ConfigMap{}
				obj = c
				defer func() { m.configMaps[c.Name] = c }()
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				obj = p
				m.pdbs = append(m.pdbs, p)
			default:
				t.Fatalf("%s: unexpected kind %q %q", where, tm.APIVersion, tm.Kind)
			}
			if err := decodeStrict(doc, obj); err != nil {
				t.Fatalf("%s (%s): %v", where, tm.Kind, err)
			}
		}
	}
	if m.sts == nil {
		t.Fatal("no StatefulSet")
	}
	return m
}

// decodeStrict decodes one YAML document into obj as the API server
// would, and stricter: field names match case-sensitively, and an unknown
// or duplicate field is an error (sigs.k8s.io/yaml's UnmarshalStrict goes
// through encoding/json, which would take clusterIp for clusterIP).
func decodeStrict(doc []byte, obj any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		return fmt.Errorf("%v", strict)
	}
	return nil
}

// TestStrictDecodeRejectsUnknownFields: the decoding load uses refuses a
// misspelt field, a field in the wrong case and a duplicate, so a
// manifest that passes has none.
func TestStrictDecodeRejectsUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: v1\nkind: Service\nspec:\n  clusterIp: None\n",
		"apiVersion: v1\nkind: Service\nspec:\n  publishNotReady: true\n",
		"apiVersion: v1\nkind: Service\nspec:\n  clusterIP: None\n  clusterIP: 10.0.0.1\n",
	} {
		if err := decodeStrict([]byte(doc), &corev1.Service{}); err == nil {
			t.Errorf("decodes: %q", doc)
		}
	}
	if err := decodeStrict([]byte("apiVersion: v1\nkind: Service\nspec:\n  clusterIP: None\n"), &corev1.Service{}); err != nil {
		t.Errorf("a good Service: %v", err)
	}
}

// args parses the container's serve arguments: --name=value or --name
// value; every name must be one of serve's flags.
func args(t *testing.T, c corev1.Container) map[string][]string {
	t.Helper()
	a := append(append([]string(nil), c.Command...), c.Args...)
	if len(a) == 0 || a[0] != "serve" {
		t.Fatalf("container %s runs %q, want serve …", c.Name, a)
	}
	out := map[string][]string{}
	for i := 1; i < len(a); i++ {
		name, ok := strings.CutPrefix(a[i], "--")
		if !ok {
			t.Fatalf("argument %q is not a flag", a[i])
		}
		name, value, hasValue := strings.Cut(name, "=")
		if !slices.Contains(serveFlags, name) {
			t.Fatalf("--%s is not a serve flag", name)
		}
		if !hasValue && !slices.Contains(boolFlags, name) {
			i++
			if i == len(a) {
				t.Fatalf("--%s has no value", name)
			}
			value = a[i]
		}
		out[name] = append(out[name], value)
	}
	return out
}

// one returns the single value of flag name.
func one(t *testing.T, a map[string][]string, name string) string {
	t.Helper()
	if len(a[name]) != 1 {
		t.Fatalf("--%s given %d times, want once: %q", name, len(a[name]), a[name])
	}
	return a[name][0]
}

func port(t *testing.T, hostPort string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("%q is not host:port", hostPort)
	}
	return int32(n)
}

// containerPort resolves a probe's or a Service's target port on c.
func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, p.StrVal)
	return 0
}

func namedPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	return containerPort(t, c, intstr.FromString(name))
}

// TestProbesAndPorts: the container's ports are the ones its flags listen
// on; liveness asks /livez (never a path that turns 503 when the node is
// fenced), readiness /readyz, both on the API's port; the grace period
// outlasts serve's shutdown budget.
func TestProbesAndPorts(t *testing.T) {
	m := load(t)
	spec := m.sts.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	c := spec.Containers[0]
	a := args(t, c)
	api := port(t, one(t, a, "api"))
	if api != defaultAPIPort {
		t.Errorf("--api port %d, want the default %d (dns: discovery asks peers on the port it names)", api, defaultAPIPort)
	}
	if got := namedPort(t, c, "api"); got != api {
		t.Errorf("container port api %d, --api listens on %d", got, api)
	}
	if got := namedPort(t, c, "grpc"); got != port(t, one(t, a, "grpc")) {
		t.Errorf("container port grpc %d, --grpc %s", got, one(t, a, "grpc"))
	}
	listen := one(t, a, "listen")
	if want := fmt.Sprintf("/ip4/0.0.0.0/tcp/%d", defaultMeshPort); listen != want {
		t.Errorf("--listen %s, want %s", listen, want)
	}
	if got := namedPort(t, c, "mesh"); got != defaultMeshPort {
		t.Errorf("container port mesh %d, --listen %s", got, listen)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"liveness", c.LivenessProbe, livePath},
		{"readiness", c.ReadinessProbe, readyPath},
		{"startup", c.StartupProbe, livePath},
	} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || containerPort(t, c, g.Port) != api || g.Scheme == corev1.URISchemeHTTPS {
			t.Errorf("%s probe %s %v %s, want GET %s on the API port %d over HTTP", p.name, g.Path, g.Port.String(), g.Scheme, p.path, api)
		}
	}
	grace := time.Duration(0)
	if spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	}
	if grace <= shutdownBudget {
		t.Errorf("terminationGracePeriodSeconds %v, want more than serve's shutdown budget %v", grace, shutdownBudget)
	}
}

// TestDiscoveryAndService: the dns: bootstrap entry names the headless
// Service that the StatefulSet is governed by, on the API port; that
// Service publishes not-ready pods (a joining pod must be found to
// become ready) and selects the pods; so does the client Service, on
// ready pods; the PodDisruptionBudget selects them too.
func TestDiscoveryAndService(t *testing.T) {
	m := load(t)
	tmpl := m.sts.Spec.Template
	c := tmpl.Spec.Containers[0]
	a := args(t, c)
	podLabels := labels.Set(tmpl.Labels)
	sel, err := metav1.LabelSelectorAsSelector(m.sts.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Fatalf("the StatefulSet's selector %v does not match its pods' labels %v", m.sts.Spec.Selector, podLabels)
	}
	var dns []string
	for _, b := range a["bootstrap"] {
		if hp, ok := strings.CutPrefix(b, dnsPrefix); ok {
			dns = append(dns, hp)
		}
	}
	if len(dns) != 1 {
		t.Fatalf("bootstrap %q: want one dns:HOST:PORT entry", a["bootstrap"])
	}
	host, p, err := net.SplitHostPort(dns[0])
	if err != nil {
		t.Fatalf("bootstrap dns:%s: %v", dns[0], err)
	}
	name := strings.Split(host, ".")[0]
	if m.sts.Spec.ServiceName != name {
		t.Errorf("the StatefulSet's serviceName %q, the bootstrap names %q", m.sts.Spec.ServiceName, name)
	}
	svc, ok := m.services[name]
	if !ok {
		t.Fatalf("no Service %q for the bootstrap dns:%s", name, dns[0])
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: clusterIP %q publishNotReadyAddresses %v, want headless and publishing not-ready pods", name, svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	if want := strconv.Itoa(int(port(t, one(t, a, "api")))); p != want {
		t.Errorf("bootstrap dns:%s asks port %s, the API listens on %s", dns[0], p, want)
	}
	for _, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s selects %v, not the pods %v", s.Name, s.Spec.Selector, podLabels)
		}
		for _, sp := range s.Spec.Ports {
			if got, want := containerPort(t, c, sp.TargetPort), sp.Port; got != want {
				t.Errorf("Service %s port %s: %d to the container's %d", s.Name, sp.Name, want, got)
			}
		}
	}
	if len(m.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(m.pdbs))
	}
	pdb := m.pdbs[0]
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("the PodDisruptionBudget's selector %v does not match the pods", pdb.Spec.Selector)
	}
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.IntValue() != 1 {
		t.Errorf("maxUnavailable %v, want 1", mu)
	}
}

// TestVolumes: --data-dir is the volumeClaimTemplate's mount (the peer
// identity survives a restart); --config is a key of the ConfigMap,
// mounted as a directory (a subPath mount never sees an update), and the
// file names rules; --psk-file and --token-file are keys of the Secret.
func TestVolumes(t *testing.T) {
	m := load(t)
	spec := m.sts.Spec.Template.Spec
	c := spec.Containers[0]
	a := args(t, c)
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.Name] = vm
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	// mountOf returns the volume mounted at path's directory.
	mountOf := func(path string) (corev1.VolumeMount, bool) {
		for _, vm := range c.VolumeMounts {
			if filepath.Dir(path) == vm.MountPath {
				return vm, true
			}
		}
		return corev1.VolumeMount{}, false
	}

	if len(m.sts.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("%d volumeClaimTemplates, want 1 for the data dir", len(m.sts.Spec.VolumeClaimTemplates))
	}
	claim := m.sts.Spec.VolumeClaimTemplates[0].Name
	if vm, ok := mounts[claim]; !ok || vm.MountPath != one(t, a, "data-dir") || vm.ReadOnly {
		t.Errorf("--data-dir %s is not the claim %q's writable mount (%+v)", one(t, a, "data-dir"), claim, vm)
	}

	cfg := one(t, a, "config")
	vm, ok := mountOf(cfg)
	if !ok || vm.SubPath != "" || volumes[vm.Name].ConfigMap == nil {
		t.Fatalf("--config %s is not in a ConfigMap mounted as a directory (%+v)", cfg, vm)
	}
	cmName := volumes[vm.Name].ConfigMap.Name
	cm, ok := m.configMaps[cmName]
	if !ok {
		t.Fatalf("no ConfigMap %q", cmName)
	}
	text, ok := cm.Data[filepath.Base(cfg)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cmName, filepath.Base(cfg))
	}
	var file struct {
		Rules []map[string]any `json:"rules"`
	}
	if err := yaml.Unmarshal([]byte(text), &file); err != nil || len(file.Rules) == 0 {
		t.Errorf("ConfigMap %s's %s names no rules (%v): serve would warn that only the built-in default exists", cmName, filepath.Base(cfg), err)
	}

	for _, flag := range []string{"psk-file", "token-file"} {
		path := one(t, a, flag)
		vm, ok := mountOf(path)
		if !ok || !vm.ReadOnly {
			t.Errorf("--%s %s is not on a read-only mount", flag, path)
			continue
		}
		sec := volumes[vm.Name].Secret
		if sec == nil {
			t.Errorf("--%s %s is not from a Secret", flag, path)
			continue
		}
		found := len(sec.Items) == 0
		for _, it := range sec.Items {
			found = found || it.Path == filepath.Base(path)
		}
		if !found {
			t.Errorf("--%s %s: Secret %s's items %v lack %s", flag, path, sec.SecretName, sec.Items, filepath.Base(path))
		}
	}
	if sc := spec.SecurityContext; sc == nil || sc.FSGroup == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("the pod must run as non-root with an fsGroup (the data volume must be writable by it): %+v", sc)
	}
}
