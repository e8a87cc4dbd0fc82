// Package kyverno runs a real Kyverno (v1.19.1, built from source by hack/kyverno-bin.sh) against
// a running test cluster: its admission, background and reports controllers as processes on the
// test machine (the three the Helm chart runs by default), with their webhooks registered by URL (https://127.0.0.1:PORT), each
// authenticated as its own ServiceAccount under the RBAC Kyverno's Helm chart installs (rbac.go).
//
//	k := kyverno.Start(t, cluster.Config)   // CRDs, namespace, RBAC, ConfigMaps, the processes; waits until ready
//	kyverno.Start(t, cfg, kyverno.OnlyLabelledNamespaces()) // its webhooks see only namespaces with NamespaceLabels
//	k.WaitPolicyReady(t, "", "my-clusterpolicy")
//	k.Restart(t)                            // the admission controller killed and started again
//	kyverno.InstallCRDs(t, cluster.Config)  // only the CRDs: Kyverno's policies can be written, none acts
//
// Stop (run at the end of the test) kills the processes and deletes Kyverno's webhook
// configurations, whose failurePolicy Fail would otherwise refuse every matching request. The
// processes' logs are files in the test's temp dir, printed when the test fails.
//
// A cluster shared by tests that do not run Kyverno starts it with OnlyLabelledNamespaces: its
// resource webhooks (failurePolicy Fail) then never see the other tests' namespaces, whose writes
// are neither refused while Kyverno restarts nor slowed by it.
package kyverno

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/kubeconfig"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// Version is the Kyverno hack/kyverno-bin.sh builds.
const Version = "v1.19.1"

// BinEnv names the variable that points at the folder hack/kyverno-bin.sh fills (make test-e2e and
// .ci/run set it).
const BinEnv = "QM_KYVERNO_BIN"

// WebhookLabel is the label Kyverno puts on every webhook configuration it registers.
const WebhookLabel = "webhook.kyverno.io/managed-by"

// Process identities Kyverno is told (KYVERNO_POD_NAME): its leader-election holder identities.
const (
	admissionPod  = "kyverno-admission-controller-local"
	backgroundPod = "kyverno-background-controller-local"
	reportsPod    = "kyverno-reports-controller-local"
)

// ExceptionNamespace is the one namespace where Kyverno accepts PolicyExceptions: every controller
// runs with --enablePolicyException and --exceptionNamespace, as its chart's
// features.policyExceptions {enabled: true, namespace: kyverno-exceptions} runs them.
const ExceptionNamespace = "kyverno-exceptions"

// exceptionFlags are the chart's flags of features.policyExceptions, on each controller.
var exceptionFlags = []string{"--enablePolicyException=true", "--exceptionNamespace=" + ExceptionNamespace}

// ReportsLease is the leader-election Lease (in Namespace) of Kyverno's reports controller.
const ReportsLease = "kyverno-reports-controller"

// BackgroundScanInterval is how often the reports controller scans every workload again in full
// (its --backgroundScanInterval; the chart's is an hour): the bound on how long a report it wrote
// without a new PolicyException stays so (Start).
const BackgroundScanInterval = time.Minute

// Timeouts of the condition waits (never of an assertion): a cold start on a busy 2-core machine.
const (
	readyTimeout = 3 * time.Minute
	pollEvery    = 200 * time.Millisecond
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// BinDir is the folder holding the kyverno, background-controller and reports-controller binaries
// and crds/: $QM_KYVERNO_BIN
// when set, otherwise what hack/kyverno-bin.sh prints (it builds Kyverno on first use, about 5
// minutes on 2 cores, then answers at once from its cache).
func BinDir() (string, error) {
	binOnce.Do(func() {
		if dir := os.Getenv(BinEnv); dir != "" {
			binDir = dir
		} else {
			fmt.Fprintf(os.Stderr, "kyverno: %s is not set; running hack/kyverno-bin.sh (a cold build takes about 5 minutes)\n", BinEnv)
			var stderr bytes.Buffer
			cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "kyverno-bin.sh"))
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				binErr = fmt.Errorf("building Kyverno (hack/kyverno-bin.sh): %w\n%s", err, stderr.String())
				return
			}
			binDir = testenv.LastLine(out)
		}
		for _, f := range []string{"kyverno", "background-controller", "reports-controller", "crds"} {
			if _, err := os.Stat(filepath.Join(binDir, f)); err != nil {
				binErr = fmt.Errorf("%s (%s=%q): %w; run hack/kyverno-bin.sh", f, BinEnv, binDir, err)
				return
			}
		}
	})
	return binDir, binErr
}

// TB is what the harness needs of a test; testing.TB has it, and so can a command that runs
// Kyverno outside a test (hack/demo-helper, for make demo): Fatal and Fatalf must not return,
// and Cleanup's functions must run when the caller is done with Kyverno.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	TempDir() string
	Cleanup(func())
	Failed() bool
}

// Kyverno is a running Kyverno.
type Kyverno struct {
	// WebhookAddr is where the admission controller serves its webhooks (127.0.0.1:PORT), the
	// same across restarts.
	WebhookAddr string

	t          TB
	admin      *rest.Config
	c          client.Client
	cs         *kubernetes.Clientset
	bin        string
	dir        string
	admission  *process
	background *process
	reports    *process
	stopped    bool
}

// Start installs Kyverno's CRDs, namespace, ServiceAccounts, RBAC and ConfigMaps with the admin
// configuration, starts the admission, background and reports controllers, and returns once Kyverno
// is ready: its webhooks registered and the API server getting Kyverno's answers through them, the
// background and reports controllers leading. Stop is registered as a cleanup.
func Start(t TB, admin *rest.Config, opts ...Option) *Kyverno {
	t.Helper()
	o := options{webhookNamespaces: chartNamespaces()}
	for _, opt := range opts {
		opt(&o)
	}
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, admin)
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	k := &Kyverno{t: t, admin: admin, c: c, cs: cs, bin: bin, dir: t.TempDir(), WebhookAddr: freeAddr(t)}
	t.Cleanup(func() {
		if t.Failed() {
			k.printLogs()
		}
		k.Stop()
	})
	ctx := context.Background()

	installCRDs(t, c, bin)
	for _, obj := range installObjects(o.webhookNamespaces) {
		if err := apply(ctx, c, obj); err != nil {
			t.Fatalf("installing %T %s: %v", obj, obj.GetName(), err)
		}
	}
	// RBAC is in force once the aggregation controller has filled the aggregated ClusterRoles and
	// the authorizer sees them: asked as each ServiceAccount, a rule of each role is allowed.
	k.waitAllowed(t, AdmissionServiceAccount, authorizationv1.ResourceAttributes{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Verb: "get"})
	k.waitAllowed(t, AdmissionServiceAccount, authorizationv1.ResourceAttributes{Namespace: Namespace, Resource: "secrets", Verb: "create"})
	k.waitAllowed(t, BackgroundServiceAccount, authorizationv1.ResourceAttributes{Group: "kyverno.io", Resource: "updaterequests", Verb: "watch"})
	k.waitAllowed(t, BackgroundServiceAccount, authorizationv1.ResourceAttributes{Resource: "configmaps", Verb: "create"})
	k.waitAllowed(t, ReportsServiceAccount, authorizationv1.ResourceAttributes{Group: "wgpolicyk8s.io", Resource: "policyreports", Verb: "create"})

	k.admission = k.newProcess(t, "kyverno", AdmissionServiceAccount, admissionPod, AdmissionDeployment,
		"--caSecretName="+CASecretName,
		"--tlsSecretName="+TLSSecretName,
		"--serverIP="+k.WebhookAddr,
		"--webhookServerHost=127.0.0.1",
		"--webhookServerPort="+port(k.WebhookAddr),
		"--servicePort=443",
		"--backgroundServiceAccountName=system:serviceaccount:"+Namespace+":"+BackgroundServiceAccount,
		"--metricsHost=127.0.0.1", "--metricsPort="+port(freeAddr(t)),
		"--controllerRuntimeMetricsAddress="+freeAddr(t),
		exceptionFlags[0], exceptionFlags[1],
	)
	k.background = k.newProcess(t, "background-controller", BackgroundServiceAccount, backgroundPod, BackgroundDeployment,
		"--metricsHost=127.0.0.1", "--metricsPort="+port(freeAddr(t)),
		"--controllerRuntimeMetricsAddress="+freeAddr(t),
		exceptionFlags[0], exceptionFlags[1],
	)
	// The chart's defaults: background scans, admission reports and their aggregation into
	// PolicyReports (wgpolicyk8s.io; openreports off), events other than violations omitted; but a
	// full rescan every minute (backgroundScanInterval), not every hour. Kyverno 1.19's reports
	// controller rescans every workload the moment a kyverno.io/v2 PolicyException is written, while
	// the index its engine finds exceptions in is filled by a queue of its own: a workload scanned
	// before that queue caught up is reported without the exception and, its report marked with the
	// exception's version, is not scanned again until the interval passes (seen under load: 1 of 3
	// workloads skipped after 5 minutes). A cluster with the chart's interval sees such a count
	// corrected within the hour (docs/intents.md); the tests within a minute.
	k.reports = k.newProcess(t, "reports-controller", ReportsServiceAccount, reportsPod, ReportsDeployment,
		"--metricsHost=127.0.0.1", "--metricsPort="+port(freeAddr(t)),
		"--omitEvents=PolicyApplied,PolicySkipped",
		"--backgroundScanInterval="+BackgroundScanInterval.String(),
		exceptionFlags[0], exceptionFlags[1],
	)
	k.admission.start(t)
	k.background.start(t)
	k.reports.start(t)
	k.waitReady(t)
	k.waitLeader(t, "kyverno-background-controller", backgroundPod, k.background)
	k.waitLeader(t, ReportsLease, reportsPod, k.reports)
	return k
}

// InstallCRDs installs Kyverno's CRDs alone and waits until the API server serves them: a cluster
// where Kyverno's policies can be written but no Kyverno runs yet (its chart's CRDs applied before
// its controllers start). Start installs them too.
func InstallCRDs(t TB, admin *rest.Config) {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	installCRDs(t, newClient(t, admin), bin)
}

func installCRDs(t TB, c client.Client, bin string) {
	t.Helper()
	crds, err := readCRDs(filepath.Join(bin, "crds"))
	if err != nil {
		t.Fatalf("Kyverno's CRDs: %v", err)
	}
	for _, crd := range crds {
		if err := apply(context.Background(), c, crd); err != nil {
			t.Fatalf("installing the CRD %s: %v", crd.Name, err)
		}
	}
	for _, crd := range crds {
		poll(t, "the CRD "+crd.Name+" to be Established", func(ctx context.Context) (bool, string) {
			return crdEstablished(ctx, c, crd.Name)
		})
	}
}

// newClient is an admin client that knows the built-in kinds and CRDs and drops the API server's
// warnings (Kyverno warns about its readiness probe's policy and its deprecated kinds).
func newClient(t TB, admin *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), apiextensionsv1.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	quiet := rest.CopyConfig(admin)
	quiet.WarningHandler = rest.NoWarnings{}
	c, err := client.New(quiet, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Restart kills the admission controller (SIGKILL, as a crash) and starts it again, and waits
// until it is ready. Its webhooks stay registered meanwhile, so requests they match are refused
// while it is down, as in a cluster.
func (k *Kyverno) Restart(t TB) {
	t.Helper()
	k.KillAdmission(t)
	k.StartAdmission(t)
}

// KillAdmission kills the admission controller (SIGKILL) and waits until it has exited.
func (k *Kyverno) KillAdmission(t TB) {
	t.Helper()
	k.admission.kill()
}

// StartAdmission starts the admission controller again after KillAdmission and waits until it is
// ready.
func (k *Kyverno) StartAdmission(t TB) {
	t.Helper()
	k.admission.start(t)
	k.waitReady(t)
}

// KillReports kills the reports controller (SIGKILL) and waits until it has exited: its Lease
// stops being renewed, as when its Pod is gone.
func (k *Kyverno) KillReports(t TB) {
	t.Helper()
	k.reports.kill()
}

// StartReports starts the reports controller again after KillReports and waits until it leads.
func (k *Kyverno) StartReports(t TB) {
	t.Helper()
	k.reports.start(t)
	k.waitLeader(t, ReportsLease, reportsPod, k.reports)
}

// Stop kills the processes and deletes the webhook configurations Kyverno registered. Safe to
// call more than once; Start registers it as a cleanup.
func (k *Kyverno) Stop() {
	if k.stopped {
		return
	}
	k.stopped = true
	for _, p := range []*process{k.admission, k.background, k.reports} {
		if p != nil {
			p.kill()
		}
	}
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: WebhookLabel}
	var errs []error
	if err := k.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		errs = append(errs, err)
	}
	if err := k.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		k.t.Errorf("deleting Kyverno's webhook configurations: %v", err)
	}
}

// Logs returns the admission, background and reports controllers' logs so far.
func (k *Kyverno) Logs() string {
	var b strings.Builder
	for _, p := range []*process{k.admission, k.background, k.reports} {
		if p == nil {
			continue
		}
		data, _ := os.ReadFile(p.logPath)
		fmt.Fprintf(&b, "=== %s (%s)\n%s\n", p.name, p.logPath, data)
	}
	return b.String()
}

func (k *Kyverno) printLogs() {
	const keep = 300
	for _, p := range []*process{k.admission, k.background, k.reports} {
		if p == nil {
			continue
		}
		data, _ := os.ReadFile(p.logPath)
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > keep {
			lines = append([]string{fmt.Sprintf("... (%d earlier lines)", len(lines)-keep)}, lines[len(lines)-keep:]...)
		}
		k.t.Logf("Kyverno %s log (%s):\n%s", p.name, p.logPath, strings.Join(lines, "\n"))
	}
}

// WaitPolicyReady waits until the kyverno.io Policy namespace/name (a ClusterPolicy when namespace
// is "") reports Ready in its status, and fails the test with Kyverno's message when it does not
// within a few minutes.
func (k *Kyverno) WaitPolicyReady(t TB, namespace, name string) {
	t.Helper()
	WaitPolicyReady(t, k.c, namespace, name)
}

// WaitPolicyReady is Kyverno.WaitPolicyReady with any client that may read the policy.
func WaitPolicyReady(t TB, c client.Client, namespace, name string) {
	t.Helper()
	kind := "ClusterPolicy"
	if namespace != "" {
		kind = "Policy"
	}
	poll(t, fmt.Sprintf("%s %s/%s to be Ready", kind, namespace, name), func(ctx context.Context) (bool, string) {
		obj := &unstructured.Unstructured{}
		obj.SetAPIVersion("kyverno.io/v1")
		obj.SetKind(kind)
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
			return false, err.Error()
		}
		return intent.KyvernoPolicyStatus(obj.Object)
	})
}

// apply creates obj, or updates it to obj when it exists.
func apply(ctx context.Context, c client.Client, obj client.Object) error {
	err := c.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	existing := obj.DeepCopyObject().(client.Object)
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return err
	}
	obj.SetResourceVersion(existing.GetResourceVersion())
	if cr, ok := obj.(*rbacv1.ClusterRole); ok && cr.AggregationRule != nil {
		cr.Rules = existing.(*rbacv1.ClusterRole).Rules // the aggregation controller's
	}
	return c.Update(ctx, obj)
}

// waitAllowed waits until the API server's authorizer allows the ServiceAccount attrs.
func (k *Kyverno) waitAllowed(t TB, serviceAccount string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	waitAllowed(t, k.c, serviceAccount, attrs)
}

func waitAllowed(t TB, c client.Client, serviceAccount string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	user := "system:serviceaccount:" + Namespace + ":" + serviceAccount
	poll(t, fmt.Sprintf("%s to be allowed to %s %s", user, attrs.Verb, attrs.Resource), func(ctx context.Context) (bool, string) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + Namespace, "system:authenticated"},
			ResourceAttributes: &attrs,
		}}
		if err := c.Create(ctx, sar); err != nil {
			return false, err.Error()
		}
		return sar.Status.Allowed, sar.Status.Reason
	})
}

// waitReady waits until the admission controller leads, its webhook configurations point at it,
// and the API server gets its answer through the policy validation webhook: a dry-run
// ClusterPolicy that only Kyverno's own validation refuses (two operations in one rule).
func (k *Kyverno) waitReady(t TB) {
	t.Helper()
	k.waitLeader(t, "kyverno", admissionPod, k.admission)
	url := "https://" + k.WebhookAddr + "/"
	poll(t, "Kyverno's webhook configurations to point at "+k.WebhookAddr, func(ctx context.Context) (bool, string) {
		if msg := k.admission.exited(); msg != "" {
			return false, msg
		}
		want := map[string]bool{
			"kyverno-policy-validating-webhook-cfg":   false,
			"kyverno-resource-validating-webhook-cfg": false,
			"kyverno-policy-mutating-webhook-cfg":     false,
			"kyverno-resource-mutating-webhook-cfg":   false,
			"kyverno-verify-mutating-webhook-cfg":     false,
		}
		vwcs, err := k.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: WebhookLabel})
		if err != nil {
			return false, err.Error()
		}
		mwcs, err := k.cs.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: WebhookLabel})
		if err != nil {
			return false, err.Error()
		}
		check := func(name string, hooks []admissionregistrationv1.WebhookClientConfig) {
			if _, ok := want[name]; !ok {
				return
			}
			ok := true
			for _, h := range hooks {
				ok = ok && h.URL != nil && strings.HasPrefix(*h.URL, url) && len(h.CABundle) > 0
			}
			want[name] = ok
		}
		for _, w := range vwcs.Items {
			var hooks []admissionregistrationv1.WebhookClientConfig
			for _, h := range w.Webhooks {
				hooks = append(hooks, h.ClientConfig)
			}
			check(w.Name, hooks)
		}
		for _, w := range mwcs.Items {
			var hooks []admissionregistrationv1.WebhookClientConfig
			for _, h := range w.Webhooks {
				hooks = append(hooks, h.ClientConfig)
			}
			check(w.Name, hooks)
		}
		var missing []string
		for name, ok := range want {
			if !ok {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0, "not yet registered at " + url + ": " + strings.Join(missing, ", ")
	})
	probe := probePolicy()
	poll(t, "Kyverno's policy webhook to answer through the API server", func(ctx context.Context) (bool, string) {
		if msg := k.admission.exited(); msg != "" {
			return false, msg
		}
		err := k.c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if err == nil {
			return false, "the probe policy was admitted"
		}
		return strings.Contains(err.Error(), `admission webhook "validate-policy.kyverno.svc" denied the request`), err.Error()
	})
}

// probePolicy is a ClusterPolicy the CRD's schema accepts and Kyverno's validation refuses.
func probePolicy() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
		"metadata": map[string]any{"name": "qm-kyverno-readiness-probe"},
		"spec": map[string]any{"rules": []any{map[string]any{
			"name":     "two-operations",
			"match":    map[string]any{"any": []any{map[string]any{"resources": map[string]any{"kinds": []any{"ConfigMap"}}}}},
			"validate": map[string]any{"message": "x", "deny": map[string]any{}},
			"mutate":   map[string]any{"patchStrategicMerge": map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}},
		}}},
	}}
}

// waitLeader waits until the process holds its leader-election Lease and has renewed it since it
// started (a restarted process has the identity of the one before it).
func (k *Kyverno) waitLeader(t TB, lease, holder string, p *process) {
	t.Helper()
	started := p.startedAt()
	poll(t, p.name+" to hold the Lease "+Namespace+"/"+lease, func(ctx context.Context) (bool, string) {
		if msg := p.exited(); msg != "" {
			return false, msg
		}
		l := &coordinationv1.Lease{}
		if err := k.c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: lease}, l); err != nil {
			return false, err.Error()
		}
		if l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
			return false, "no holder"
		}
		return *l.Spec.HolderIdentity == holder && l.Spec.RenewTime.After(started),
			fmt.Sprintf("held by %s, renewed %s (the process started %s)", *l.Spec.HolderIdentity, l.Spec.RenewTime.Format(time.RFC3339Nano), started.Format(time.RFC3339Nano))
	})
}

// poll checks cond every pollEvery until it holds, and fails the test with what and cond's last
// detail after readyTimeout (Kyverno's logs are printed then). It is testenv.PollFor for a TB
// that need not be a testing.TB (a Program).
func poll(t TB, what string, cond func(context.Context) (bool, string)) {
	t.Helper()
	last := ""
	err := wait.PollUntilContextTimeout(context.Background(), pollEvery, readyTimeout, true, func(ctx context.Context) (bool, error) {
		ok, detail := cond(ctx)
		last = detail
		return ok, nil
	})
	if err != nil {
		t.Fatalf("Kyverno: timed out waiting for %s (%s)", what, last)
	}
}

// process is one Kyverno command run as a ServiceAccount.
type process struct {
	name    string
	path    string
	args    []string
	env     []string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{}
	err     error
}

func (p *process) startedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

func (k *Kyverno) newProcess(t TB, name, serviceAccount, pod, deployment string, args ...string) *process {
	t.Helper()
	kc := k.serviceAccountKubeconfig(t, serviceAccount)
	path := filepath.Join(k.dir, name+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return &process{
		name:    name,
		path:    filepath.Join(k.bin, name),
		args:    append([]string{"--kubeconfig=" + path, "--disableLogColor=true"}, args...),
		logPath: filepath.Join(k.dir, name+".log"),
		env: append(os.Environ(),
			"KYVERNO_NAMESPACE="+Namespace,
			"KYVERNO_SERVICEACCOUNT_NAME="+serviceAccount,
			"KYVERNO_DEPLOYMENT="+deployment,
			"KYVERNO_POD_NAME="+pod,
			"INIT_CONFIG="+ConfigMapName,
			"METRICS_CONFIG="+MetricsConfigMapName,
		),
	}
}

// serviceAccountKubeconfig is a kubeconfig authenticated with a token of the ServiceAccount (two
// hours: longer than any e2e run).
func (k *Kyverno) serviceAccountKubeconfig(t TB, name string) []byte {
	t.Helper()
	secs := int64((2 * time.Hour).Seconds())
	tr, err := k.cs.CoreV1().ServiceAccounts(Namespace).CreateToken(context.Background(), name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token for %s/%s: %v", Namespace, name, err)
	}
	ca := k.admin.CAData
	if len(ca) == 0 && k.admin.CAFile != "" {
		if ca, err = os.ReadFile(k.admin.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	data, err := kubeconfig.Render(kubeconfig.Params{Name: name, Server: k.admin.Host, CAData: ca, Token: tr.Status.Token, Namespace: Namespace})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func (p *process) start(t TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(log, "--- %s %s\n", time.Now().Format(time.RFC3339), strings.Join(append([]string{p.path}, p.args...), " "))
	cmd := exec.Command(p.path, p.args...) //nolint:gosec // the binary hack/kyverno-bin.sh built
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("starting Kyverno's %s: %v", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.started, p.done, p.err = cmd, started, done, nil
	go func() {
		err := cmd.Wait()
		log.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
}

// exited says how the process ended, or "" while it runs.
func (p *process) exited() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return fmt.Sprintf("Kyverno's %s exited: %v (log: %s)", p.name, p.err, p.logPath)
	default:
		return ""
	}
}

// kill sends SIGKILL and waits until the process has exited.
func (p *process) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

func freeAddr(t TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
