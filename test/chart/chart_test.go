// Package chart tests the Helm chart charts/quartermaster offline: helm lint, golden renders of a
// few value sets, which RBAC each set installs, that the chart's RBAC and admission policies are
// config/rbac's, and that bad values fail at install. test/e2e installs it on the local cluster.
package chart

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/quartermaster-dev/quartermaster/internal/testing/chart"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

var update = flag.Bool("update", false, "rewrite the golden renders under testdata")

// valueSets are the value files under testdata, each rendered to testdata/NAME.golden.yaml.
var valueSets = []string{"default", "all", "minimal"}

const (
	release   = "quartermaster"
	namespace = "quartermaster-system"
)

func valuesFile(name string) string {
	return filepath.Join("test", "chart", "testdata", name+".values.yaml")
}

// render renders with Helm 4: what the chart renders is the same with Helm 3
// (TestRendersAsTheGoldenFiles).
func render(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := chart.Template(testenv.Helm4, release, namespace, extra...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := chart.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestLint: helm lint --strict passes with each Helm major.
func TestLint(t *testing.T) {
	for _, h := range testenv.Helms {
		for _, set := range valueSets {
			out, err := h.Run("lint", "--strict", chart.Dir, "-f", valuesFile(set))
			if err != nil {
				t.Errorf("%s, %s: %v\n%s", h, set, err, out)
			}
		}
	}
}

// TestRendersAsTheGoldenFiles: Helm 4 renders each value set exactly as its golden file (-update
// writes them), and Helm 3 renders the same objects (its text differs in blank lines only: Helm 3
// trims each template's trailing whitespace).
func TestRendersAsTheGoldenFiles(t *testing.T) {
	for _, h := range testenv.Helms {
		for _, set := range valueSets {
			t.Run(h.String()+"/"+set, func(t *testing.T) { testRendersAsTheGoldenFile(t, h, set) })
		}
	}
}

func testRendersAsTheGoldenFile(t *testing.T, h testenv.Helm, set string) {
	rendered, err := chart.Template(h, release, namespace, "-f", valuesFile(set))
	if err != nil {
		t.Fatal(err)
	}
	got := withoutCRDSchemas(rendered)
	path := filepath.Join("testdata", set+".golden.yaml")
	if *update && h == testenv.Helm4 {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./test/chart -update writes it)", err)
	}
	if h != testenv.Helm4 {
		sameObjects(t, h, got, want)
		return
	}
	if !bytes.Equal(got, want) {
		t.Errorf("helm template with %s differs from %s (go test ./test/chart -update rewrites it; review the diff):\n%s",
			valuesFile(set), path, firstDifference(string(want), string(got)))
	}
}

// sameObjects fails unless the manifest h rendered holds the golden manifest's objects, in order.
func sameObjects(t *testing.T, h testenv.Helm, got, golden []byte) {
	t.Helper()
	gotObjs, err := chart.Objects(got)
	if err != nil {
		t.Fatal(err)
	}
	wantObjs, err := chart.Objects(golden)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := chart.Names(gotObjs), chart.Names(wantObjs); !slices.Equal(g, w) {
		t.Fatalf("%s renders %v,\nHelm 4 (the golden file) %v", h, g, w)
	}
	for i := range gotObjs {
		if !equality.Semantic.DeepEqual(gotObjs[i].Object, wantObjs[i].Object) {
			a, _ := yaml.Marshal(gotObjs[i].Object)
			b, _ := yaml.Marshal(wantObjs[i].Object)
			t.Errorf("%s renders %s differently from Helm 4 (the golden file):\n%s", h, chart.Names(gotObjs[i : i+1])[0], firstDifference(string(b), string(a)))
		}
	}
}

// withoutCRDSchemas cuts each CRD after its metadata: the CRDs are config/crd/bases' (hack/chart-files.sh,
// checked by make verify-generated), and an API change should not need a chart golden update.
func withoutCRDSchemas(manifest []byte) []byte {
	docs := strings.Split(string(manifest), "\n---\n")
	for i, d := range docs {
		if strings.Contains(d, "# Source: quartermaster/templates/crds/") {
			if j := strings.Index(d, "\nspec:\n"); j >= 0 {
				docs[i] = d[:j] + "\nspec: {} # (config/crd/bases)"
			}
		}
	}
	return []byte(strings.Join(docs, "\n---\n"))
}

func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl
		}
	}
	return ""
}

// TestInstallsOnlyTheEnabledControllersRBAC: each controller's generated roles, bindings and
// admission policies come with it and only with it; the IAM compat role only with compat on.
func TestInstallsOnlyTheEnabledControllersRBAC(t *testing.T) {
	perController := map[string][]string{ // ClusterRoles and admission policies each controller brings
		"namespaces": {"ClusterRole quartermaster-namespaces", "ValidatingAdmissionPolicy quartermaster-manager-scope", "ValidatingAdmissionPolicy quartermaster-manager-namespaces", "ValidatingAdmissionPolicy quartermaster-exchange-requests"},
		"vmgroups":   {"ClusterRole quartermaster-vmgroups", "ClusterRole quartermaster-vmgroups-user-data"},
		"iam":        {"ClusterRole quartermaster-iam"},
		"mirrors":    {"ClusterRole quartermaster-mirrors", "ClusterRole quartermaster-node-agent", "Role quartermaster-mirror-cache", "ServiceAccount quartermaster-mirror-cache", "ValidatingAdmissionPolicy quartermaster-manager-workloads", "ValidatingAdmissionPolicy quartermaster-manager-pods", "ValidatingAdmissionPolicy quartermaster-node-agent"},
		"intents":    {"ClusterRole quartermaster-intents", "ValidatingAdmissionPolicy quartermaster-manager-kyverno"},
	}
	// No oidcIssuer: it is optional (a cluster that uses only Pod Identity has none).
	iamOn := []string{"--set", "iam.enabled=true", "--set", "iam.clusterName=c"}
	cases := []struct {
		name string
		args []string
		on   []string
		more []string // further objects that must be there
		not  []string // objects that must not
	}{
		{"default", nil, []string{"namespaces", "mirrors", "intents"}, []string{"ClusterRole quartermaster-mirrors-pins", "ClusterRoleBinding quartermaster-mirrors-pins"},
			[]string{"ClusterRole quartermaster-iam-compat", "Role quartermaster-intents-k8tls"}},
		{"mirrors without pinning", []string{"--set", "mirrors.pinByUse=false"}, []string{"namespaces", "mirrors", "intents"}, nil,
			[]string{"ClusterRole quartermaster-mirrors-pins", "ClusterRoleBinding quartermaster-mirrors-pins"}},
		{"iam without compat", append(iamOn, "--set", "namespaces.enabled=false", "--set", "mirrors.enabled=false", "--set", "intents.enabled=false"),
			[]string{"iam"}, []string{"ClusterRoleBinding quartermaster-iam"}, []string{"ClusterRole quartermaster-iam-compat", "ClusterRoleBinding quartermaster-iam-compat"}},
		{"all", []string{"-f", valuesFile("all")}, []string{"namespaces", "vmgroups", "iam", "mirrors", "intents"},
			[]string{"ClusterRole quartermaster-iam-compat", "ClusterRoleBinding quartermaster-iam-compat", "Role quartermaster-intents-k8tls", "ValidatingAdmissionPolicy quartermaster-manager-k8tls-scans", "ClusterRoleBinding quartermaster-metrics-reader"}, nil},
		{"minimal", []string{"-f", valuesFile("minimal")}, []string{"namespaces"}, nil,
			[]string{"CustomResourceDefinition vmgroups.compute.quartermaster.dev", "PodDisruptionBudget quartermaster-manager", "Service quartermaster-metrics"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.args...)
			have := map[string]bool{}
			for _, o := range objs {
				have[o.GetKind()+" "+o.GetName()] = true
			}
			for c, names := range perController {
				for _, n := range names {
					if want := slices.Contains(tc.on, c); have[n] != want {
						t.Errorf("%s: with controllers %v, present=%v, want %v", n, tc.on, have[n], want)
					}
				}
			}
			for _, n := range tc.more {
				if !have[n] {
					t.Errorf("%s is missing", n)
				}
			}
			for _, n := range tc.not {
				if have[n] {
					t.Errorf("%s is installed", n)
				}
			}
			// Every generated role is bound, to the manager's ServiceAccount.
			for _, o := range objs {
				kind := o.GetKind()
				if (kind != "ClusterRole" && kind != "Role") || strings.HasSuffix(o.GetName(), "-editor") || strings.HasSuffix(o.GetName(), "-viewer") ||
					slices.Contains(unboundRoles, o.GetName()) {
					continue
				}
				if !have[kind+"Binding "+o.GetName()] {
					t.Errorf("%s %s has no binding", kind, o.GetName())
				}
			}
			// The manager runs exactly the enabled controllers.
			args := managerArgs(t, objs)
			if want := "--controllers=" + strings.Join(tc.on, ","); !slices.Contains(args, want) {
				t.Errorf("the manager's args %v do not hold %s", args, want)
			}
		})
	}
}

// unboundRoles are the roles installed for others to bind (metrics scrapers, the copy sources' namespace, the namespaces whose
// VmGroups use user data) and the node agents' (node_agent.yaml binds it to the agents).
var unboundRoles = []string{"quartermaster-metrics-reader", "quartermaster-vmgroups-user-data", "quartermaster-namespaces-copy-source", "quartermaster-node-agent",
	// Aggregated into Kyverno's background controller's ClusterRole, not bound.
	"quartermaster-intents-kyverno-mutate-existing", "quartermaster-intents-kyverno-generate-kubearmor"}

func managerArgs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	d := chart.Find(objs, "Deployment", "quartermaster-manager")
	if d == nil {
		t.Fatal("no Deployment quartermaster-manager")
	}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	var args []string
	for _, a := range containers[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	return args
}

// TestRBACIsConfigRBAC: rendered as config/ names things (release quartermaster in
// quartermaster-system), the chart's roles, bindings and admission policies are exactly those of
// config/local (config/rbac with the IAM compat binding): one source, the markers and config/rbac.
func TestRBACIsConfigRBAC(t *testing.T) {
	objs := render(t, "-f", valuesFile("all"))
	kubectl := filepath.Join(testenv.Assets(t), "kubectl")
	cmd := exec.Command(kubectl, "kustomize", "config/local")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/local: %v", err)
	}
	kustomized, err := chart.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	// config/rbac binds every role the markers generate (role_bindings.yaml, by hand).
	for _, k := range kustomized {
		if kind := k.GetKind(); (kind == "ClusterRole" || kind == "Role") && !slices.Contains(unboundRoles, k.GetName()) &&
			chart.Find(kustomized, kind+"Binding", k.GetName()) == nil {
			t.Errorf("config/local has %s %s/%s and no binding of it", kind, k.GetNamespace(), k.GetName())
		}
	}
	compared := 0
	for _, k := range kustomized {
		var fields []string
		switch k.GetKind() {
		case "ClusterRole", "Role":
			fields = []string{"rules"}
		case "ClusterRoleBinding", "RoleBinding":
			fields = []string{"roleRef", "subjects"}
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			fields = []string{"spec"}
		case "ServiceAccount":
		default:
			continue
		}
		i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
			return o.GetKind() == k.GetKind() && o.GetName() == k.GetName() && o.GetNamespace() == k.GetNamespace()
		})
		if i < 0 {
			t.Errorf("config/local has %s %s/%s, the chart does not", k.GetKind(), k.GetNamespace(), k.GetName())
			continue
		}
		for _, f := range fields {
			if !equality.Semantic.DeepEqual(k.Object[f], objs[i].Object[f]) {
				t.Errorf("%s %s/%s: %s differs from config/local's:\nchart:  %v\nconfig: %v", k.GetKind(), k.GetNamespace(), k.GetName(), f, objs[i].Object[f], k.Object[f])
			}
		}
		compared++
	}
	t.Logf("compared %d objects of config/local", compared)
	if compared < 30 {
		t.Errorf("compared only %d objects of config/local", compared)
	}
}

// TestRefusesBadValues: values.schema.json makes helm fail before anything is installed, with
// each Helm major.
func TestRefusesBadValues(t *testing.T) {
	for _, h := range testenv.Helms {
		t.Run(h.String(), func(t *testing.T) { testRefusesBadValues(t, h) })
	}
}

func testRefusesBadValues(t *testing.T, h testenv.Helm) {
	for _, tc := range []struct {
		set, want string
	}{
		{"iam.enabled=true", "/iam/clusterName"},
		{"vmgroups.enabled=true", "/vmgroups/vcenterSecret"},
		{"replicas=3", "additional properties 'replicas' not allowed"},
		{"namespaces.tokenTTL=3days", "/namespaces/tokenTTL"},
		{"iam.aws.roleArn=my-role", "/iam/aws/roleArn"},
		{"image.digest=latest", "/image/digest"},
		{"mirrors.namespace=Mirrors", "/mirrors/namespace"},
		{"metrics.port=70000", "/metrics/port"},
		{"vmgroups.maxReplicas=1001", "/vmgroups/maxReplicas"},
	} {
		_, err := chart.Template(h, release, namespace, "--set", tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: got %v, want an error naming %s", tc.set, err, tc.want)
		}
	}
	// And no controller at all is refused by the template itself.
	_, err := chart.Template(h, release, namespace, "--set", "namespaces.enabled=false", "--set", "mirrors.enabled=false", "--set", "intents.enabled=false")
	if err == nil || !strings.Contains(err.Error(), "enable at least one controller") {
		t.Errorf("no controller: got %v, want refused", err)
	}
}

// TestPrometheusRuleIsConfigPrometheus: the chart's alerts are config/prometheus's, and the leader
// alert follows leaderElection.id.
func TestPrometheusRuleIsConfigPrometheus(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	config, err := chart.Objects(b)
	if err != nil || len(config) != 1 {
		t.Fatalf("config/prometheus: %d objects, %v", len(config), err)
	}
	rule := chart.Find(render(t, "-f", valuesFile("all")), "PrometheusRule", "quartermaster")
	if rule == nil {
		t.Fatal("no PrometheusRule quartermaster with metrics.prometheusRule.enabled")
	}
	if !equality.Semantic.DeepEqual(rule.Object["spec"], config[0].Object["spec"]) {
		t.Errorf("the chart's PrometheusRule differs from config/prometheus's")
	}
	if rule.GetNamespace() != namespace {
		t.Errorf("PrometheusRule in %q, want the release namespace", rule.GetNamespace())
	}
	renamed := chart.Find(render(t, "--set", "metrics.prometheusRule.enabled=true", "--set", "leaderElection.id=team-lease"), "PrometheusRule", "quartermaster")
	if renamed == nil {
		t.Fatal("no PrometheusRule")
	}
	spec, _ := yaml.Marshal(renamed.Object["spec"])
	if !strings.Contains(string(spec), `name="team-lease"`) || strings.Contains(string(spec), "quartermaster.quartermaster.dev") {
		t.Errorf("the leader alert does not follow leaderElection.id:\n%s", spec)
	}
}

// TestGrafanaDashboardIsConfigGrafana: metrics.grafanaDashboard ships config/grafana's dashboard,
// as JSON, for Grafana's sidecar, its leader panel following leaderElection.id.
func TestGrafanaDashboardIsConfigGrafana(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "grafana", "quartermaster-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	dashboard := func(args ...string) (*unstructured.Unstructured, map[string]any) {
		t.Helper()
		cm := chart.Find(render(t, append([]string{"--set", "metrics.grafanaDashboard.enabled=true"}, args...)...), "ConfigMap", "quartermaster-dashboard")
		if cm == nil {
			t.Fatal("no ConfigMap quartermaster-dashboard with metrics.grafanaDashboard.enabled")
		}
		data, _, _ := unstructured.NestedString(cm.Object, "data", "quartermaster-dashboard.json")
		var d map[string]any
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			t.Fatalf("the dashboard is not JSON: %v", err)
		}
		return cm, d
	}
	cm, got := dashboard()
	var config map[string]any
	if err := json.Unmarshal(want, &config); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, config) {
		t.Error("the chart's dashboard differs from config/grafana's")
	}
	if cm.GetLabels()["grafana_dashboard"] != "1" || cm.GetNamespace() != namespace {
		t.Errorf("labels %v in %q, want grafana_dashboard=1 in the release namespace", cm.GetLabels(), cm.GetNamespace())
	}
	_, renamed := dashboard("--set", "leaderElection.id=team-lease")
	b, _ := json.Marshal(renamed)
	if !strings.Contains(string(b), `name=\"team-lease\"`) || strings.Contains(string(b), "quartermaster.quartermaster.dev") {
		t.Error("the leader panel does not follow leaderElection.id")
	}
}

// TestEveryFlagHasAValue: each flag of the manager is set from a value of the chart, or is one the
// chart leaves to extraArgs on purpose. A controller's new flag fails this until the chart has it.
func TestEveryFlagHasAValue(t *testing.T) {
	leftToExtraArgs := []string{
		"kubeconfig",         // in-cluster
		"operator-namespace", // from POD_NAMESPACE
		"metrics-secure",     // always HTTPS with authorization
		"enable-http2",       // off (CVE-2023-44487)
		"pprof-bind-address", // for a debugging session, with port-forward
		"zap-devel", "zap-encoder", "zap-stacktrace-level", "zap-time-encoding",
	}
	bin := filepath.Join(t.TempDir(), "quartermaster")
	if err := testenv.GoBuild(bin, "./cmd/quartermaster"); err != nil {
		t.Fatal(err)
	}
	help, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("quartermaster --help: %v\n%s", err, help)
	}
	template, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), chart.Dir, "templates", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	flags := 0
	_, flagLines, _ := strings.Cut(string(help), "\nFlags:\n")
	for line := range strings.Lines(flagLines) {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "--")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(strings.TrimSpace(name), " ")
		flags++
		if slices.Contains(leftToExtraArgs, name) {
			continue
		}
		if !strings.Contains(string(template), `"`+name+`"`) && !strings.Contains(string(template), "--"+name+"=") &&
			!strings.Contains(string(template), `"--`+name+`"`) {
			t.Errorf("the manager's flag --%s has no value in the chart (templates/deployment.yaml, values.yaml, values.schema.json) nor a reason to leave it to extraArgs", name)
		}
	}
	if flags < 40 {
		t.Fatalf("read %d flags from --help:\n%s", flags, help)
	}
}
