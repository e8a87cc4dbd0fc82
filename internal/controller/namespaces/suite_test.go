package namespaces

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/pipelineid"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// env is the package's API server (TestMain): each test keeps to a requests namespace of its own
// (Options.RequestsNamespace, which the labels of everything made for its requests name) and to
// names of Namespaces no other test requests. (The names are literal: with -count above 1 a run
// finds the Namespaces of the one before, which envtest never deletes.)
var env *testenv.Env

func TestMain(m *testing.M) {
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr), zap.Level(zap.Options{}.Level)))
	os.Exit(testenv.Package(m, &env, func(e *testenv.Env) error { return nsv1alpha1.AddToScheme(e.Scheme) }))
}

// operatorNS is the fixtures' operator namespace: the controller only refuses it as a request's
// name (it is never made), so the tests share it.
const operatorNS = "quartermaster-system"

// fixture is the namespaces controller running in a manager, serving a requests namespace of its own.
type fixture struct {
	c          client.Client
	rns        string // the requests namespace
	reconciler *Reconciler
	opts       *Options
	running    *testenv.Running
}

// stop stops the fixture's manager before the test ends (stopping again is harmless).
func (f *fixture) stop(t *testing.T) {
	t.Helper()
	running := f.running
	f.running = nil
	if err := running.Stop(); err != nil {
		t.Errorf("manager: %v", err)
	}
}

var defaultsYAML = `
resourceQuota:
  hard: {pods: "20", requests.cpu: "2"}
limitRange:
  limits:
    - type: Container
      default: {cpu: 500m, memory: 256Mi}
isolateNetwork: true
profiles:
  small:
    resourceQuota:
      hard: {pods: "5"}
`

// start runs the controller serving a new requests namespace; tweak adjusts its options before it starts.
func start(t *testing.T, tweak func(*Options)) *fixture {
	t.Helper()
	return runController(t, env.Namespace(t), tweak)
}

// runController runs the controller serving the requests namespace rns.
func runController(t *testing.T, rns string, tweak func(*Options)) *fixture {
	t.Helper()
	defaults := filepath.Join(t.TempDir(), "defaults.yaml")
	if err := os.WriteFile(defaults, []byte(defaultsYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	o := &Options{
		RequestsNamespace: rns, OperatorNamespace: operatorNS, DefaultsFile: defaults,
		TokenTTL: 24 * time.Hour, MaxTokenTTL: 48 * time.Hour, DenyNames: "kube-.*,default", Concurrency: 4,
	}
	if tweak != nil {
		tweak(o)
	}
	policy, d, err := o.policy()
	if err != nil {
		t.Fatal(err)
	}
	cacheOpts, _ := manager.CacheOptions([]controllers.Controller{o.controller()})
	mgr, err := ctrl.New(env.Config, ctrl.Options{
		Scheme:  env.Scheme,
		Cache:   cacheOpts,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// envtest runs several managers in one process: controller names must not collide.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReconciler(mgr, policy, d, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetupWithManager(mgr, o.Concurrency); err != nil {
		t.Fatal(err)
	}
	if o.ExchangeAddress != "" {
		if err := addExchange(mgr, o, policy, d, &pipelineid.Verifier{Client: o.ExchangeClient}); err != nil {
			t.Fatal(err)
		}
	}
	running := testenv.Run(mgr)
	f := &fixture{c: env.Client, rns: rns, reconciler: r, opts: o, running: running}
	t.Cleanup(func() { f.stop(t) })
	return f
}

// request creates a request ConfigMap.
func (f *fixture) request(t *testing.T, name string, data map[string]string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.rns, Name: name}, Data: data}
	if err := f.c.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	return cm
}

// waitStatus waits until the request shows status and returns it.
func (f *fixture) waitStatus(t *testing.T, name string, status nsrequest.Status) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	eventually(t, "request "+name+" to be "+string(status), func() bool {
		err := f.c.Get(context.Background(), client.ObjectKey{Namespace: f.rns, Name: name}, cm)
		return err == nil && cm.Annotations[nsrequest.AnnotationStatus] == string(status)
	}, func() string { return cm.Annotations[nsrequest.AnnotationMessage] })
	return cm
}

// events lists the Events about an object.
func (f *fixture) events(t *testing.T, obj client.Object) []eventsv1.Event {
	t.Helper()
	return testenv.EventsAbout(t, f.c, obj)
}

func (f *fixture) waitEvent(t *testing.T, obj client.Object, reason string) eventsv1.Event {
	t.Helper()
	return testenv.WaitForEvent(t, f.c, obj, reason)
}

// eventually is testenv.PollFor every 50 ms for up to 30 s; detail, when not nil, says what
// was last seen.
func eventually(t *testing.T, what string, cond func() bool, detail func() string) {
	t.Helper()
	testenv.PollFor(t, what, 50*time.Millisecond, 30*time.Second, func() (bool, string) {
		ok := cond()
		if detail == nil {
			return ok, ""
		}
		return ok, detail()
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
