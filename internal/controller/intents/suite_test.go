package intents

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/enginecrds"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// env is the package's API server, with KubeArmor's CRDs: TestSharedManager's tests run on it.
var env *testenv.Env

// runtimeLogs are what controller-runtime logs outside a manager's logger (its sources, the API
// server's warnings), for a failed run; each manager logs to its fixture's buffer.
var runtimeLogs testenv.LogBuffer

func TestMain(m *testing.M) {
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(&runtimeLogs)))
	code := runPackage(m)
	if code != 0 {
		fmt.Fprintf(os.Stderr, "controller-runtime's own logs (last 20 kB):\n%s\n", runtimeLogs.Tail(20000))
	}
	os.Exit(code)
}

func runPackage(m *testing.M) int {
	crds, err := os.MkdirTemp("", "kubearmor-crds")
	if err == nil {
		defer os.RemoveAll(crds)
		err = enginecrds.Copy(enginecrds.KubeArmorModule, enginecrds.KubeArmor, crds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return testenv.Package(m, &env, nil, crds)
}

var nameSeq atomic.Int64

// unique returns name with a suffix of its own, for TestSharedManager's cluster-scoped objects
// and the namespaces a test names: the package's server keeps every test's objects, those of a
// test run again (-count) included.
func unique(name string) string { return fmt.Sprintf("%s-%d", name, nameSeq.Add(1)) }

// fixture is an envtest API server with KubeArmor's CRDs (Kyverno's are installed by a test,
// late) and the intents controller running.
type fixture struct {
	env    *testenv.Env
	c      client.Client
	scheme *runtime.Scheme
	logs   *testenv.LogBuffer
	mgr    ctrl.Manager // the running manager
	base   *base        // the running controllers' shared parts

	running *testenv.Running // the running manager; nil when none runs
	root    *testing.T       // the test the fixture lives as long as
	engines string           // --intents-engines of the managers it starts ("": all)
	// exceptions are the --intents-exception-* flags of the managers it starts.
	exceptions intent.ExceptionRules
}

// testExceptions are the fixture's --intents-exception-* flags.
var testExceptions = intent.ExceptionRules{Namespace: "kyverno-exceptions", MaxTTL: 48 * time.Hour, Warning: time.Hour}

// start runs the intents controllers on an API server of the test's own, for a test that changes
// what every test of a server shares: it installs an engine, stops or reconfigures the manager,
// or selects every namespace. Every other test is one of TestSharedManager's.
func start(t *testing.T) *fixture {
	t.Helper()
	return newFixture(t, testenv.Start(t, enginecrds.Dir(t, enginecrds.KubeArmorModule, enginecrds.KubeArmor)))
}

// newFixture runs the intents controllers on e until t ends.
func newFixture(t *testing.T, e *testenv.Env) *fixture {
	t.Helper()
	f := &fixture{env: e, logs: &testenv.LogBuffer{}, root: t, exceptions: testExceptions}
	f.scheme = manager.Scheme(intentv1alpha1.AddToScheme, securityv1alpha1.AddToScheme, apiextensionsv1.AddToScheme)
	c, err := client.New(f.env.Config, client.Options{Scheme: f.scheme})
	must(t, err)
	f.c = c
	f.run(t)
	t.Cleanup(func() {
		f.stop(t)
		if t.Failed() {
			t.Logf("controller logs (last 20 kB):\n%s", f.logs.Tail(20000))
		}
	})
	return f
}

// newManager makes a manager with the intents controllers set up (not started).
func (f *fixture) newManager(t *testing.T) (ctrl.Manager, *base) {
	t.Helper()
	mgr, err := ctrl.New(f.env.Config, ctrl.Options{
		Scheme:     f.scheme,
		Logger:     zap.New(zap.UseDevMode(true), zap.WriteTo(f.logs)),
		Cache:      cache.Options{DefaultTransform: cachemeta.Transform},
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	kinds, err := controllers.NewKinds(mgr, 200*time.Millisecond)
	must(t, err)
	b, err := setup(mgr, kinds, Options{Concurrency: 4, Engines: f.engines, Exceptions: f.exceptions}, 200*time.Millisecond)
	must(t, err)
	return mgr, b
}

// run starts a new manager with the intents controllers.
func (f *fixture) run(t *testing.T) {
	t.Helper()
	mgr, b := f.newManager(t)
	f.mgr, f.base = mgr, b
	f.running = testenv.Run(mgr)
}

// stop stops the running manager, if any.
func (f *fixture) stop(t *testing.T) {
	t.Helper()
	if err := f.running.Stop(); err != nil {
		t.Errorf("manager: %v", err)
	}
	f.running = nil
}

// installKyverno installs Kyverno's CRDs, as a cluster admin installing the engine late would,
// and starts the stand-in for Kyverno's status writes (acceptKyvernoPolicies).
func (f *fixture) installKyverno(t *testing.T) {
	t.Helper()
	f.installKyvernoCRDs(t, enginecrds.Kyverno...)
	f.acceptKyvernoPolicies(t)
}

// installKyvernoCRDs creates the CRDs of files in Kyverno's module (paths within it).
func (f *fixture) installKyvernoCRDs(t *testing.T, files ...string) {
	t.Helper()
	dir := enginecrds.Dir(t, enginecrds.KyvernoModule, files)
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join(dir, filepath.Base(file)))
		must(t, err)
		crd := &apiextensionsv1.CustomResourceDefinition{}
		must(t, yaml.Unmarshal(b, crd))
		must(t, f.c.Create(context.Background(), crd))
	}
}

// acceptKyvernoPolicies stands in for Kyverno, which envtest does not run: to each Kyverno policy
// with no status conditions yet it does only what Kyverno does once the policy is in its webhooks,
// a status Ready=True. (The e2e runs the real Kyverno.)
func (f *fixture) acceptKyvernoPolicies(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.root.Cleanup(cancel) // as long as the fixture: Kyverno stays installed
	// The CRDs were created a moment ago: the cache's mapper must see them served.
	eventually(t, "Kyverno's kinds served", func() (bool, string) {
		_, err := f.c.RESTMapper().RESTMapping(intent.KyvernoClusterPolicyKind.GroupKind(), "v1")
		return err == nil, fmt.Sprint(err)
	})
	c, err := cache.New(f.env.Config, cache.Options{Scheme: f.scheme})
	must(t, err)
	accept := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		if _, ok, _ := unstructured.NestedSlice(u.Object, "status", "conditions"); ok {
			return // Kyverno has said what it says
		}
		accepted := u.DeepCopy()
		_ = unstructured.SetNestedSlice(accepted.Object, []any{map[string]any{
			"type": "Ready", "status": "True", "reason": "Succeeded", "message": "Ready",
			"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
		}}, "status", "conditions")
		_ = f.c.Status().Update(ctx, accepted) // a conflict brings an update event, and another try
	}
	for _, gvk := range []schema.GroupVersionKind{intent.KyvernoPolicyKind, intent.KyvernoClusterPolicyKind} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		inf, err := c.GetInformer(ctx, u)
		must(t, err)
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: accept, UpdateFunc: func(_, obj any) { accept(obj) },
		})
		must(t, err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("the Kyverno stand-in's cache did not sync")
	}
}

func (f *fixture) namespace(t *testing.T, name string) {
	t.Helper()
	must(t, f.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

func (f *fixture) intent(t *testing.T, name, id string, params map[string]intentv1alpha1.ParamValues) *intentv1alpha1.SecurityIntent {
	t.Helper()
	si := &intentv1alpha1.SecurityIntent{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: id, Action: "Block", Description: "about " + id, Params: params}},
	}
	must(t, f.c.Create(context.Background(), si))
	return si
}

func (f *fixture) binding(t *testing.T, ns, name string, labels map[string]string, intents ...string) *intentv1alpha1.SecurityIntentBinding {
	t.Helper()
	sib := &intentv1alpha1.SecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"team": "web"}},
		Spec:       intentv1alpha1.SecurityIntentBindingSpec{Selector: intentv1alpha1.MatchWorkloads{WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: labels}}},
	}
	for _, i := range intents {
		sib.Spec.Intents = append(sib.Spec.Intents, intentv1alpha1.MatchIntent{Name: i})
	}
	must(t, f.c.Create(context.Background(), sib))
	return sib
}

// get reads obj again.
func (f *fixture) get(t *testing.T, obj client.Object) {
	t.Helper()
	must(t, f.c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj))
}

// engineObject reads an engine policy.
func (f *fixture) engineObject(kind, ns, name string) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{}
	group := map[string]string{"KubeArmorPolicy": "security.kubearmor.com/v1", "NetworkPolicy": "networking.k8s.io/v1",
		"Policy": "kyverno.io/v1", "ClusterPolicy": "kyverno.io/v1"}[kind]
	u.SetAPIVersion(group)
	u.SetKind(kind)
	return u, f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, u)
}

// eventually polls cond until it holds.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, what, cond)
}

// waitPolicyStatus waits until the NimbusPolicy lists exactly entries and has Ready reason.
func (f *fixture) waitPolicyStatus(t *testing.T, np *intentv1alpha1.NimbusPolicy, reason string, entries ...string) {
	t.Helper()
	eventually(t, fmt.Sprintf("NimbusPolicy %s/%s %s with %v", np.Namespace, np.Name, reason, entries), func() (bool, string) {
		if err := f.c.Get(context.Background(), client.ObjectKeyFromObject(np), np); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(np.Status.Conditions, "Ready")
		got := fmt.Sprintf("%v %v", np.Status.Policies, c)
		return c != nil && c.Reason == reason && c.ObservedGeneration == np.Generation &&
			fmt.Sprint(np.Status.Policies) == fmt.Sprint(entries) && int(np.Status.NumberOfAdapterPolicies) == len(entries), got
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
