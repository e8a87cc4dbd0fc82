package mirrors

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const testNamespace = "quartermaster-mirrors"

// fixture is one envtest API server with the mirrors controller running as it would in the
// operator, its API requests counted, and two loopback upstreams: one open to anonymous pulls
// and one that wants the user "puller" with the password "right" (or "rotated").
type fixture struct {
	env     *testenv.Env
	scheme  *runtime.Scheme
	c       client.Client
	logs    *testenv.LogBuffer
	opts    Options
	r       *Reconciler             // the running manager's
	api     *testenv.RequestCounter // API requests of the running manager
	open    string                  // the open upstream's URL
	guarded string                  // the upstream that wants credentials

	running *testenv.Running // the running manager; nil when none runs
}

func start(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{logs: &testenv.LogBuffer{}}
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(f.logs), zap.StacktraceLevel(zapcore.PanicLevel)))
	f.env = testenv.Start(t)
	f.scheme = manager.Scheme(registryv1alpha1.AddToScheme)
	c, err := client.New(f.env.Config, client.Options{Scheme: f.scheme})
	must(t, err)
	f.c = c
	must(t, c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}))
	f.open, f.guarded = upstreams(t)

	f.opts = Options{
		Namespace: testNamespace, Image: "quartermaster:test", AgentServiceAccount: "quartermaster-node-agent",
		CacheServiceAccount: "quartermaster-mirror-cache", Concurrency: 4, Resync: time.Hour, CheckUpstream: true, PrepareStorage: true, PinByUse: true,
	}
	must(t, f.opts.validate())
	f.run(t)
	t.Cleanup(func() {
		f.stop(t)
		if t.Failed() {
			t.Logf("controller logs (last 20 kB):\n%s", f.logs.Tail(20000))
		}
	})
	return f
}

// newManager makes a manager with the mirrors controller set up as in the operator (not started),
// its API requests counted.
func (f *fixture) newManager(t *testing.T) (ctrl.Manager, *Reconciler, *testenv.RequestCounter) {
	t.Helper()
	cfg, api := testenv.Counting(f.env.Config)
	mgr, err := ctrl.New(cfg, ctrl.Options{
		Scheme:     f.scheme,
		Cache:      cache.Options{DefaultTransform: cachemeta.Transform},
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	r, err := setup(mgr, f.opts)
	must(t, err)
	r.slowRetry = time.Second
	return mgr, r, api
}

// run starts a new manager with the mirrors controller.
func (f *fixture) run(t *testing.T) {
	t.Helper()
	mgr, r, api := f.newManager(t)
	f.r, f.api = r, api
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

// upstreams serves /v2/ as registries do: the open one to anyone, the guarded one with a Basic
// challenge to anyone but puller with the password right or rotated.
func upstreams(t *testing.T) (open, guarded string) {
	t.Helper()
	o := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		_, _ = w.Write([]byte("{}"))
	}))
	t.Cleanup(o.Close)
	g := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "puller" || (p != "right" && p != "rotated") {
			w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("{}"))
	}))
	t.Cleanup(g.Close)
	return o.URL, g.URL
}

// mirrorOf is a RegistryMirror of upstream for host.
func mirrorOf(name, upstream, host string) *registryv1alpha1.RegistryMirror {
	return &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       registryv1alpha1.RegistryMirrorSpec{UpstreamURL: upstream, MirrorHost: host},
	}
}

func (f *fixture) create(t *testing.T, obj client.Object) {
	t.Helper()
	must(t, f.c.Create(context.Background(), obj))
}

// patch reads obj, changes it with change and sends the difference as a merge patch, as kubectl
// patch does: no optimistic lock, so the controller's own writes in between do not refuse it.
func (f *fixture) patch(t *testing.T, obj client.Object, change func()) {
	t.Helper()
	ctx := context.Background()
	must(t, f.c.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	base := obj.DeepCopyObject().(client.Object)
	change()
	must(t, f.c.Patch(ctx, obj, client.MergeFrom(base)))
}

// waitReason waits until the mirror's Ready condition has reason for its current generation and
// returns the mirror as read.
func (f *fixture) waitReason(t *testing.T, name, reason string) *registryv1alpha1.RegistryMirror {
	t.Helper()
	return f.waitMirror(t, name, reason, nil)
}

// waitMirror waits until the mirror's Ready condition has reason for its current generation and
// cond, if any, holds for the mirror as read; it returns that mirror. A status is written after
// the objects it counts, so a test reads a count through this wait, never once.
func (f *fixture) waitMirror(t *testing.T, name, reason string, cond func(*registryv1alpha1.RegistryMirror) (bool, string)) *registryv1alpha1.RegistryMirror {
	t.Helper()
	rm := &registryv1alpha1.RegistryMirror{}
	testenv.Eventually(t, fmt.Sprintf("RegistryMirror %s Ready reason %s", name, reason), func() (bool, string) {
		if err := f.c.Get(context.Background(), client.ObjectKey{Name: name}, rm); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionReady)
		if c == nil {
			return false, "no Ready condition"
		}
		if c.Reason != reason || c.ObservedGeneration != rm.Generation {
			return false, c.Reason + ": " + c.Message
		}
		if cond == nil {
			return true, ""
		}
		return cond(rm)
	})
	return rm
}

// object reads one of a mirror's objects from the mirrors' namespace.
func (f *fixture) object(t *testing.T, name string, obj client.Object) {
	t.Helper()
	must(t, f.c.Get(context.Background(), client.ObjectKey{Namespace: testNamespace, Name: name}, obj))
}

// waitObject waits until the object exists and cond holds for it.
func (f *fixture) waitObject(t *testing.T, name string, obj client.Object, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%T %s", obj, name), func() (bool, string) {
		if err := f.c.Get(context.Background(), client.ObjectKey{Namespace: testNamespace, Name: name}, obj); err != nil {
			return false, err.Error()
		}
		if cond == nil {
			return true, ""
		}
		return cond()
	})
}

// becomeReady plays the StatefulSet and DaemonSet controllers (envtest runs none): every cache
// pod ready and every one of nodes configured.
func (f *fixture) becomeReady(t *testing.T, name string, nodes int32) {
	t.Helper()
	ctx := context.Background()
	sts := &appsv1.StatefulSet{}
	f.waitObject(t, mirror.CacheName(name), sts, nil)
	n := *sts.Spec.Replicas
	sts.Status = appsv1.StatefulSetStatus{ObservedGeneration: sts.Generation, Replicas: n, ReadyReplicas: n, UpdatedReplicas: n, AvailableReplicas: n, CurrentReplicas: n}
	must(t, f.c.Status().Update(ctx, sts))
	ds := &appsv1.DaemonSet{}
	f.waitObject(t, mirror.AgentName(name), ds, nil)
	ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: nodes, CurrentNumberScheduled: nodes,
		NumberReady: nodes, UpdatedNumberScheduled: nodes, NumberAvailable: nodes}
	must(t, f.c.Status().Update(ctx, ds))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// reconcileWrites runs one reconcile of the mirror name (as the worker would, on the running
// manager's cache) and returns the API writes made meanwhile to that mirror and its objects: its
// status, its Events, its cache and agent objects. The count is scoped because the manager's
// workers keep serving the other mirrors of the suite meanwhile (a stalled one retries and repeats
// its Event); those writes are logged, not counted.
func (f *fixture) reconcileWrites(t *testing.T, name string) []string {
	t.Helper()
	before := len(f.api.WriteLog())
	if _, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: name}}); err != nil {
		t.Fatal(err)
	}
	var mine, others []string
	for _, w := range f.api.WriteLog()[before:] {
		if writesTo(w, name) {
			mine = append(mine, w)
		} else {
			others = append(others, w)
		}
	}
	if len(others) > 0 {
		t.Logf("writes to other objects meanwhile (other workers): %v", others)
	}
	return mine
}

// writesTo says whether a logged write ("METHOD /path") is to the mirror name or one of its
// objects: a path segment that is its name, names one of its objects (mirror-<name>…), or an
// Event about either (<object>.<suffix>).
func writesTo(w, name string) bool {
	_, path, _ := strings.Cut(w, " ")
	for _, seg := range strings.Split(path, "/") {
		base, _, _ := strings.Cut(seg, ".")
		if seg == name || base == name || strings.HasPrefix(base, mirror.CacheName(name)) || strings.HasPrefix(base, mirror.AgentName(name)) {
			return true
		}
	}
	return false
}
