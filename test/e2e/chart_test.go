//go:build e2e

package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/chart"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The chart's release in these tests: its own namespaces and a fullname of its own, so none of its
// cluster-scoped objects (roles, admission policies) collides with config/local's.
const (
	chartRelease   = "qm-chart"
	chartNamespace = "qm-chart-system"
	chartRequests  = "qm-chart-requests"
	chartMirrors   = "qm-chart-mirrors"
)

// TestHelmChartAsInstalled installs charts/quartermaster with helm on the local cluster, every
// controller on (CRDs off: config/local installed them; the CRD templates are checked by a server
// dry run), then runs the manager exactly as the installed Deployment's Pod says — its args, its
// environment (the downward API and the AWS credentials Secret resolved), its ConfigMap volume
// written to a temporary root — authenticated as the chart's ServiceAccount, and has every
// controller serve a sample of config/samples. A tenant bound to edit in one namespace can then
// create what the aggregated roles allow there and nothing else. Uninstalling leaves the kept
// namespaces and removes the rest.
func TestHelmChartAsInstalled(t *testing.T) {
	alone(t)
	ctx := context.Background()
	// Its manager meets KubeArmor absent first (the binding says so), then installed.
	removeKubeArmorCRD(t)
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "ubuntu-22.04-template") // the VmGroup sample's template
	emu := startIAMEmulator(t)
	upstream := newOpenRegistry(t)

	// The CA bundle handed out in kubeconfigs: the cluster's and one more, so the test tells the
	// mounted file from the CA the cluster publishes.
	caBundle := append(append([]byte{}, clusterCA(t)...), selfSignedPEM(t)...)
	values := map[string]any{
		"fullnameOverride": chartRelease,
		"image":            map[string]any{"repository": "registry.example.com/quartermaster", "tag": "e2e"},
		"crds":             map[string]any{"enabled": false},
		"leaderElection":   map[string]any{"id": "qm-chart-" + strings.ToLower(time.Now().Format("150405.000000")), "retryPeriod": "500ms"},
		"crdPollInterval":  "5s",
		"metrics":          map[string]any{"readerSubjects": []any{map[string]any{"kind": "ServiceAccount", "name": "scraper", "namespace": chartNamespace}}},
		"namespaces": map[string]any{
			"requestsNamespace": chartRequests,
			"clusterCA":         string(caBundle),
		},
		"vmgroups": map[string]any{"enabled": true, "vcenterSecret": "vcenter", "insecure": true},
		"iam": map[string]any{
			"enabled": true, "clusterName": iamCluster, "oidcIssuer": iamIssuer, "awsAccountId": iamAccount,
			"allowedPolicyArns": []any{readOnlyARN}, "configMapCompat": true,
			"aws": map[string]any{"region": "us-east-1", "iamEndpoint": emu.url, "stsEndpoint": emu.url, "credentialsSecret": "aws-credentials"},
		},
		"mirrors": map[string]any{"namespace": chartMirrors},
	}
	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	data, err := yaml.Marshal(values)
	must(t, err)
	must(t, os.WriteFile(valuesFile, data, 0o600))

	// Every CRD template is accepted by the API server (a server-side dry run: config/local's CRDs
	// are the same objects).
	crdFile := filepath.Join(t.TempDir(), "crds.yaml")
	all, err := chart.Template(testenv.Helm4, chartRelease, chartNamespace, "-f", valuesFile, "--set", "crds.enabled=true")
	must(t, err)
	objs, err := chart.Objects(all)
	must(t, err)
	var crdDocs []string
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			b, err := yaml.Marshal(o.Object)
			must(t, err)
			crdDocs = append(crdDocs, string(b))
		}
	}
	if len(crdDocs) < 9 {
		t.Fatalf("rendered %d CRDs, want every kind's", len(crdDocs))
	}
	must(t, os.WriteFile(crdFile, []byte(strings.Join(crdDocs, "---\n")), 0o600))
	kubectlOK(t, "apply", "--server-side", "--dry-run=server", "--field-manager=qm-chart-e2e", "-f", crdFile)

	// helm install, as a platform admin would, waiting for the Deployment (kwok runs its pods).
	if out, err := testenv.Helm4.Run("install", chartRelease, chart.Dir, "--namespace", chartNamespace, "--create-namespace",
		"-f", valuesFile, "--kubeconfig", cluster.Kubeconfig, "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_, _ = testenv.Helm4.Run("uninstall", chartRelease, "--namespace", chartNamespace, "--kubeconfig", cluster.Kubeconfig, "--wait")
		}
		for _, ns := range []string{chartNamespace, chartRequests, chartMirrors} {
			_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		}
	})
	must(t, waitForPolicies(ctx, chartNamespace, chartRelease+"-manager", chartRelease, chartMirrors))

	// What the manager needs before it starts, as an operator would create it (docs/install.md).
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: chartNamespace, Name: "vcenter"},
			StringData: map[string]string{"VC_HOST": sim.URL.String(), "VC_USER": sim.User, "VC_PASS": sim.Password}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: chartNamespace, Name: "aws-credentials"},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": "AKIDE2EEXAMPLE", "AWS_SECRET_ACCESS_KEY": iamSecretKey}},
	} {
		must(t, admin.Create(ctx, s))
	}

	// The manager as the installed Deployment's Pod runs it.
	deploy := &appsv1.Deployment{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: chartNamespace, Name: chartRelease + "-manager"}, deploy))
	if *deploy.Spec.Replicas != 2 || deploy.Status.ReadyReplicas != 2 {
		t.Errorf("Deployment: %d replicas, %d ready; want 2 and 2", *deploy.Spec.Replicas, deploy.Status.ReadyReplicas)
	}
	pods := &corev1.PodList{}
	must(t, admin.List(ctx, pods, client.InNamespace(chartNamespace), client.MatchingLabels(deploy.Spec.Selector.MatchLabels)))
	if len(pods.Items) != 2 || pods.Items[0].Spec.NodeName == pods.Items[1].Spec.NodeName {
		t.Errorf("want the two replicas on two nodes (anti-affinity), got %d pods", len(pods.Items))
	}
	pod := &pods.Items[0]
	proc, err := chart.ProcessFor(ctx, admin, pod, "manager", t.TempDir())
	must(t, err)
	t.Logf("the Pod's manager: args %v; env names %v; volumes skipped: %v", proc.Args, envNames(proc.Env), proc.Skipped)
	// The process environment is the test's (without its AWS settings: processEnv) plus the Pod's,
	// the machine's AWS profile and instance metadata kept out.
	env := append([]string{"AWS_PROFILE=", "AWS_CONFIG_FILE=", "AWS_SHARED_CREDENTIALS_FILE=", "AWS_EC2_METADATA_DISABLED=true"}, proc.Env...)
	mgr := startAs(t, "chart manager", chartNamespace, proc.ServiceAccount, env, proc.Args...)
	// Leading first: a manager that cannot take the Lease (its leader election Role elsewhere)
	// would only show as every sample timing out.
	leaseName := chartValue(proc.Args, "--leader-election-id")
	eventually(t, "the chart's manager to hold the Lease "+leaseName, func() bool {
		lease := &coordinationv1.Lease{}
		err := admin.Get(ctx, client.ObjectKey{Namespace: chartNamespace, Name: leaseName}, lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	})
	for _, probe := range []*corev1.Probe{pod.Spec.Containers[0].LivenessProbe, pod.Spec.Containers[0].ReadinessProbe} {
		url, err := proc.ProbeAddr(probe)
		must(t, err)
		eventually(t, "the Pod's probe "+url+" to answer 200", func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	// One controller failing stops the test: the next samples would only wait out their timeouts.
	run := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	run("metrics answer the reader bound by metrics.readerSubjects", func(t *testing.T) {
		must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: chartNamespace, Name: "scraper"}}))
		_, token, err := cluster.ServiceAccountKubeconfig(ctx, chartNamespace, "scraper", 10*time.Minute)
		must(t, err)
		insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's self-signed serving cert
		eventually(t, "GET /metrics with the scraper's token to answer 200", func() bool {
			req, _ := http.NewRequest(http.MethodGet, "https://"+proc.Ports["metrics"]+"/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := insecure.Do(req)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	})

	ns := newNamespace(t)
	run("namespaces serves a request, with the CA of the mounted file", func(t *testing.T) {
		req := requestFromSample(t, chartRequests, "qm-chart-ci-branch")
		secret := &corev1.Secret{}
		must(t, admin.Get(ctx, client.ObjectKeyFromObject(req), secret))
		cfg, err := clientcmd.Load(secret.Data["kubeconfig"])
		must(t, err)
		if len(cfg.Clusters) == 0 {
			t.Fatal("the handed-out kubeconfig names no cluster")
		}
		for _, c := range cfg.Clusters {
			if string(c.CertificateAuthorityData) != string(caBundle) {
				t.Errorf("the handed-out kubeconfig's CA is not namespaces.clusterCA (the mounted cluster-ca.crt)")
			}
		}
		must(t, admin.Get(ctx, client.ObjectKey{Name: req.GetName()}, &corev1.Namespace{}))
	})
	run("vmgroups serves the sample VmGroup", func(t *testing.T) {
		for _, o := range sample(t, "vmgroups/vmgroup.yaml") {
			o.SetNamespace(ns)
			must(t, admin.Create(ctx, o))
		}
		waitConditionReady(t, ns, "vg/web", mgr)
	})
	run("iam serves the sample IAMPolicy and IAMServiceAccount", func(t *testing.T) {
		for _, o := range append(sample(t, "iam/policy.yaml"), sample(t, "iam/serviceaccount.yaml")...) {
			o.SetNamespace(ns)
			must(t, admin.Create(ctx, o))
		}
		waitConditionReady(t, ns, "iampolicy/read-reports", mgr)
		waitConditionReady(t, ns, "iamserviceaccount/reports", mgr)
	})
	run("mirrors serves the sample RegistryMirror", func(t *testing.T) {
		const mirrorName = "qm-chart-docker-hub"
		// Reserved for the cache pod's claim: no other claim left unbound may take it.
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "qm-chart-mirror"},
			Spec: corev1.PersistentVolumeSpec{
				ClaimRef:                      &corev1.ObjectReference{Namespace: chartMirrors, Name: mirror.PVCName(mirrorName, 0)},
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/qm-chart-mirror"}},
			},
		}
		must(t, admin.Create(ctx, pv))
		t.Cleanup(func() { _ = admin.Delete(context.Background(), pv) })
		rm := sample(t, "registry/docker-hub.yaml")[0]
		// What differs on this cluster: the upstream on loopback, no credentials, one replica on
		// the volume above (no provisioner runs).
		rm.SetName(mirrorName)
		must(t, unstructured.SetNestedField(rm.Object, upstream, "spec", "upstreamUrl"))
		unstructured.RemoveNestedField(rm.Object, "spec", "credentialsSecret")
		must(t, unstructured.SetNestedField(rm.Object, int64(1), "spec", "replicas"))
		must(t, unstructured.SetNestedMap(rm.Object, map[string]any{"size": "1Gi", "storageClassName": ""}, "spec", "storage"))
		must(t, admin.Create(ctx, rm))
		t.Cleanup(func() { _ = admin.Delete(context.Background(), rm) })
		waitConditionReady(t, "", "rm/"+rm.GetName(), mgr)
	})
	run("intents serves the sample binding", func(t *testing.T) {
		for _, o := range sample(t, "intents/dns-manipulation.yaml") {
			if o.GetKind() != "SecurityIntent" {
				o.SetNamespace(ns)
			}
			must(t, admin.Create(ctx, o))
			t.Cleanup(func() { _ = admin.Delete(context.Background(), o) })
		}
		// dnsManipulation is a NetworkPolicy and a KubeArmorPolicy. Without KubeArmor the
		// binding says so (not Ready) and its NetworkPolicy is written all the same.
		eventually(t, "the binding to say KubeArmor is not installed", func() bool {
			return readyCondition(ns, "sib/dns-manipulation-binding") == "False EngineNotInstalled"
		})
		if msg := kubectlOK(t, "get", "-n", ns, "sib/dns-manipulation-binding", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`); !strings.Contains(msg, "KubeArmor") {
			t.Errorf("the binding's Ready message %q does not name KubeArmor", msg)
		}
		eventually(t, "the binding's NetworkPolicy", func() bool {
			out, err := cluster.Kubectl(ctx, "get", "-n", ns, "networkpolicies", "-o", "name")
			return err == nil && strings.Contains(out, "dns-manipulation-binding")
		})
		// Once KubeArmor's CRD is installed the chart's manager writes its policy (its RBAC
		// allows it) and the binding is Ready: KubeArmor reports nothing, so a policy that exists
		// is in force.
		installKubeArmorCRD(t)
		waitConditionReady(t, ns, "sib/dns-manipulation-binding", mgr)
		waitConditionReady(t, "", "si/dns-manipulation", mgr)
	})

	t.Run("a tenant with edit in one namespace", func(t *testing.T) { testTenantRoles(t, ns) })

	deleteNamespace(t, ns) // while the manager runs: its objects' finalizers are its own
	mgr.stop(t)
	if out, err := testenv.Helm4.Run("uninstall", chartRelease, "--namespace", chartNamespace, "--kubeconfig", cluster.Kubeconfig, "--wait"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	uninstalled = true
	for _, name := range []string{chartRequests, chartMirrors} {
		if err := admin.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{}); err != nil {
			t.Errorf("namespace %s after uninstall: %v, want kept (helm.sh/resource-policy: keep)", name, err)
		}
	}
	for _, gone := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: chartRelease + "-namespaces"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: chartRelease + "-iam-compat"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: chartRelease + "-vmgroup-editor"}},
	} {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(gone), gone); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after uninstall: %v, want gone", gone, gone.GetName(), err)
		}
	}
}

// testTenantRoles: a ServiceAccount bound to the built-in edit role in ns gets, through the chart's
// aggregated roles, VmGroups and SecurityIntentBindings there, nothing in another namespace, no
// cluster-scoped kind, and no IAM kind (iam.permissionsBoundary is not set).
func testTenantRoles(t *testing.T, ns string) {
	ctx := context.Background()
	must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant"}}))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}},
	}))
	other := newNamespace(t) // named after this subtest, so not ns
	cfg, err := restConfigAs(ctx, ns, "tenant")
	must(t, err)
	tenant, err := client.New(cfg, client.Options{})
	must(t, err)
	create := func(namespace, manifest string) error {
		o := &unstructured.Unstructured{}
		must(t, yaml.Unmarshal([]byte(manifest), &o.Object))
		o.SetNamespace(namespace)
		return tenant.Create(ctx, o, client.DryRunAll)
	}
	vmGroup := `{apiVersion: compute.quartermaster.dev/v1alpha1, kind: VmGroup, metadata: {name: tenant}, spec: {cpu: 1, memory: 1, template: t, replicas: 1}}`
	binding := `{apiVersion: intent.security.nimbus.com/v1alpha1, kind: SecurityIntentBinding, metadata: {name: tenant}, spec: {intents: [{name: dns-manipulation}], selector: {workloadSelector: {matchLabels: {app: x}}}}}`
	// The aggregation controller adds the chart's editor roles to edit shortly after install.
	eventually(t, "edit to let the tenant create a VmGroup in its namespace", func() bool { return create(ns, vmGroup) == nil })
	if err := create(ns, binding); err != nil {
		t.Errorf("a SecurityIntentBinding in the tenant's namespace: %v", err)
	}
	for what, try := range map[string]func() error{
		"a VmGroup in another namespace": func() error { return create(other, vmGroup) },
		"an IAMPolicy (no permissions boundary)": func() error {
			return create(ns, `{apiVersion: iam.quartermaster.dev/v1alpha1, kind: IAMPolicy, metadata: {name: tenant}, spec: {document: {Version: "2012-10-17", Statement: [{Effect: Allow, Action: ["*"], Resource: ["*"]}]}}}`)
		},
		"a RegistryMirror": func() error {
			return create("", `{apiVersion: registry.quartermaster.dev/v1alpha1, kind: RegistryMirror, metadata: {name: tenant}, spec: {upstreamUrl: "https://registry.example.com"}}`)
		},
		"a SecurityIntent": func() error {
			return create("", `{apiVersion: intent.security.nimbus.com/v1alpha1, kind: SecurityIntent, metadata: {name: tenant}, spec: {intent: {id: dnsManipulation, action: Block}}}`)
		},
		"a ClusterSecurityIntentBinding": func() error {
			return create("", `{apiVersion: intent.security.nimbus.com/v1alpha1, kind: ClusterSecurityIntentBinding, metadata: {name: tenant}, spec: {intents: [{name: dns-manipulation}]}}`)
		},
	} {
		if err := try(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: got %v, want Forbidden", what, err)
		}
	}
	// view (through edit) reads every namespaced kind of the namespace, the generated NimbusPolicies too.
	for _, list := range []string{"VmGroupList", "IAMServiceAccountList", "NimbusPolicyList", "SecurityIntentBindingList"} {
		l := &unstructured.UnstructuredList{}
		group := map[string]string{"VmGroupList": "compute.quartermaster.dev", "IAMServiceAccountList": "iam.quartermaster.dev"}[list]
		if group == "" {
			group = "intent.security.nimbus.com"
		}
		l.SetAPIVersion(group + "/v1alpha1")
		l.SetKind(list)
		if err := tenant.List(ctx, l, client.InNamespace(ns)); err != nil {
			t.Errorf("listing %s in the tenant's namespace: %v", list, err)
		}
	}
}

// chartValue returns the value of the flag in args (--flag=value), or "".
func chartValue(args []string, flag string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// newOpenRegistry serves an open registry root (the API version header, no auth) on loopback: the
// upstream a RegistryMirror's controller asks about credentials. It returns its URL.
func newOpenRegistry(t *testing.T) string {
	t.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		_, _ = w.Write([]byte("{}"))
	}))
	t.Cleanup(upstream.Close)
	return upstream.URL
}

// sample reads a file of config/samples as objects.
func sample(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", path))
	must(t, err)
	objs, err := chart.Objects(b)
	must(t, err)
	return objs
}

// requestFromSample creates config/samples' namespace request as name, in requestsNS (the
// sample's own when empty), deletes it and its namespace when the test ends, and waits until the
// request is Ready.
func requestFromSample(t *testing.T, requestsNS, name string) *unstructured.Unstructured {
	t.Helper()
	req := sample(t, "namespaces/request.yaml")[0]
	if requestsNS != "" {
		req.SetNamespace(requestsNS)
	}
	req.SetName(name)
	must(t, admin.Create(context.Background(), req))
	leaveNamespaces(t, name)
	t.Cleanup(func() { _ = admin.Delete(context.Background(), req) })
	eventually(t, "request "+name+" to be Ready", func() bool {
		cm := &corev1.ConfigMap{}
		err := admin.Get(context.Background(), client.ObjectKeyFromObject(req), cm)
		return err == nil && cm.Annotations[nsrequest.AnnotationStatus] == "Ready"
	})
	return req
}

// waitConditionReady waits with kubectl wait for the object's Ready condition.
func waitConditionReady(t *testing.T, ns, object string, mgr *process) {
	t.Helper()
	args := []string{"wait", object, "--for=condition=Ready", "--timeout=180s"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	if out, err := cluster.Kubectl(context.Background(), args...); err != nil {
		get := []string{"get", object, "-o", "yaml"}
		if ns != "" {
			get = append(get, "-n", ns)
		}
		status, _ := cluster.Kubectl(context.Background(), get...)
		t.Fatalf("%s: %v\n%s\nmanager logs:\n%s", out, err, status, mgr.logs.Tail(60))
	}
}

// clusterCA is the local cluster's CA bundle.
func clusterCA(t *testing.T) []byte {
	t.Helper()
	ca := cluster.Config.CAData
	if len(ca) == 0 {
		var err error
		ca, err = os.ReadFile(cluster.Config.CAFile)
		must(t, err)
	}
	return ca
}

// selfSignedPEM is a throwaway self-signed CA certificate, PEM-encoded.
func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "qm-chart-e2e-extra-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func envNames(env []string) []string {
	var out []string
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestConfigDefaultAsInstalled checks config/default the way TestHelmChartAsInstalled checks the
// chart: applied to the local cluster (every object accepted), its manager run exactly as its
// Deployment's Pod says (args, environment, the namespace defaults mounted from the generated
// ConfigMap), authenticated as its ServiceAccount, serving a namespace request.
func TestConfigDefaultAsInstalled(t *testing.T) {
	alone(t)
	ctx := context.Background()
	out := kubectlOK(t, "kustomize", "config/default")
	objs, err := chart.Objects([]byte(out))
	must(t, err)
	path := filepath.Join(t.TempDir(), "default.yaml")
	must(t, os.WriteFile(path, []byte(out), 0o600))
	kubectlOK(t, "apply", "--server-side", "-f", path)
	t.Cleanup(func() {
		// What config/local does not install: the Deployment, its Service and ConfigMap, and the
		// tenant roles (the chart's are the ones under test).
		for _, o := range objs {
			if k := o.GetKind(); k == "Deployment" || k == "Service" || k == "ConfigMap" ||
				(k == "ClusterRole" && (strings.HasSuffix(o.GetName(), "-editor") || strings.HasSuffix(o.GetName(), "-viewer"))) {
				_ = admin.Delete(context.Background(), o)
			}
		}
	})
	deploy := &appsv1.Deployment{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: "quartermaster-manager"}, deploy))
	pods := &corev1.PodList{}
	eventually(t, "the Deployment's two pods", func() bool {
		err := admin.List(ctx, pods, client.InNamespace(managerNamespace), client.MatchingLabels(deploy.Spec.Selector.MatchLabels))
		return err == nil && len(pods.Items) == 2
	})
	pod := &pods.Items[0]
	proc, err := chart.ProcessFor(ctx, admin, pod, "manager", t.TempDir())
	must(t, err)
	t.Logf("the Pod's manager: args %v; env names %v", proc.Args, envNames(proc.Env))
	startAs(t, "config-default manager", managerNamespace, proc.ServiceAccount, proc.Env, proc.Args...)
	url, err := proc.ProbeAddr(pod.Spec.Containers[0].ReadinessProbe)
	must(t, err)
	eventually(t, "the Pod's readiness probe to answer 200", func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	req := requestFromSample(t, "", "qm-default-ci-branch")
	// The namespace defaults come from the mounted file: config/manager/namespace-defaults.yaml's quota.
	quotas := &corev1.ResourceQuotaList{}
	must(t, admin.List(ctx, quotas, client.InNamespace(req.GetName())))
	if len(quotas.Items) != 1 || quotas.Items[0].Spec.Hard.Pods().String() != "50" {
		t.Errorf("the requested namespace's quotas %v, want the one of config/manager/namespace-defaults.yaml (pods: 50)", quotas.Items)
	}
}
