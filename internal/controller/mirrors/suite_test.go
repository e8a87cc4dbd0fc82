package mirrors

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
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

// testNamespace is the fixture's: its mirrors' objects are there.
const testNamespace = "quartermaster-mirrors"

var (
	// env is the package's API server.
	env *testenv.Env
	// logs is what the package's managers log (controller-runtime has one logger per process).
	logs = &testenv.LogBuffer{}
)

func TestMain(m *testing.M) {
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(logs), zap.StacktraceLevel(zapcore.PanicLevel)))
	os.Exit(testenv.Package(m, &env, nil))
}

// fixture is the mirrors controller running on the package's API server as it would in the
// operator, its API requests counted, and two loopback upstreams: one open to anonymous pulls
// and one that wants the user "puller" with the password "right" (or "rotated").
type fixture struct {
	scheme  *runtime.Scheme
	c       client.Client
	opts    Options
	r       *Reconciler             // the running manager's
	api     *testenv.RequestCounter // API requests of the running manager
	open    string                  // the open upstream's URL
	guarded string                  // the upstream that wants credentials

	running *testenv.Running // the running manager; nil when none runs
}

func start(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{scheme: manager.Scheme(registryv1alpha1.AddToScheme)}
	c, err := client.New(env.Config, client.Options{Scheme: f.scheme})
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
			t.Logf("the package's controller logs (last 20 kB):\n%s", logs.Tail(20000))
		}
	})
	return f
}

// newManager makes a manager with the mirrors controller set up as in the operator (not started),
// its API requests counted.
func (f *fixture) newManager(t *testing.T) (ctrl.Manager, *Reconciler, *testenv.RequestCounter) {
	t.Helper()
	cfg, api := testenv.Counting(env.Config)
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

// reconcileWrites runs one reconcile of the mirror name, as the worker would on the running
// manager's caches, and returns the writes that reconcile made: its API writes and its Events.
// They are counted on the reconcile's own clients and recorder, not on the manager's API traffic:
// the workers keep serving the suite's mirrors meanwhile, this one included, and a worker that
// had just written this mirror's status was counted as this reconcile's writes (its Event landing
// in the window), which made these tests flaky.
func (f *fixture) reconcileWrites(t *testing.T, name string) []string {
	t.Helper()
	// As the worker does: the reconcile reads the mirror as stored. The test may see a worker's
	// status write on the API server before the reconciler's cache does (and before the
	// reconciler records it as its own write), and would then reconcile an older mirror.
	stored, cached := &registryv1alpha1.RegistryMirror{}, &registryv1alpha1.RegistryMirror{}
	testenv.Eventually(t, "the reconciler to read mirror "+name+" as stored", func() (bool, string) {
		if err := f.c.Get(context.Background(), client.ObjectKey{Name: name}, stored); err != nil {
			return false, err.Error()
		}
		if err := f.r.client.Get(context.Background(), client.ObjectKey{Name: name}, cached); err != nil {
			return false, err.Error()
		}
		return cached.ResourceVersion == stored.ResourceVersion, "stored " + stored.ResourceVersion + ", read " + cached.ResourceVersion
	})
	var w writeLog
	r := *f.r
	r.client = &countingClient{Client: f.r.client, log: &w}
	r.objects = &countingClient{Client: f.r.objects, log: &w}
	r.recorder = &countingRecorder{EventRecorder: f.r.recorder, log: &w}
	if _, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return w.entries()
}

// writeLog is what a reconcile wrote.
type writeLog struct {
	mu  sync.Mutex
	log []string
}

func (w *writeLog) add(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.log = append(w.log, fmt.Sprintf(format, args...))
}

func (w *writeLog) entries() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.log)
}

// countingClient logs every write made through it.
type countingClient struct {
	client.Client
	log *writeLog
}

func (c *countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.log.add("create %T %s", obj, obj.GetName())
	return c.Client.Create(ctx, obj, opts...)
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.log.add("update %T %s", obj, obj.GetName())
	return c.Client.Update(ctx, obj, opts...)
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.log.add("patch %T %s", obj, obj.GetName())
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.log.add("apply %T", obj)
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.log.add("delete %T %s", obj, obj.GetName())
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *countingClient) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	c.log.add("delete all %T", obj)
	return c.Client.DeleteAllOf(ctx, obj, opts...)
}

func (c *countingClient) Status() client.SubResourceWriter {
	return &countingSubResource{SubResourceWriter: c.Client.Status(), log: c.log, name: "status"}
}

func (c *countingClient) SubResource(sub string) client.SubResourceClient {
	return &countingSubResourceClient{SubResourceClient: c.Client.SubResource(sub), log: c.log, name: sub}
}

type countingSubResource struct {
	client.SubResourceWriter
	log  *writeLog
	name string
}

func (c *countingSubResource) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	c.log.add("create %s of %T %s", c.name, obj, obj.GetName())
	return c.SubResourceWriter.Create(ctx, obj, sub, opts...)
}

func (c *countingSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	c.log.add("update %s of %T %s", c.name, obj, obj.GetName())
	return c.SubResourceWriter.Update(ctx, obj, opts...)
}

func (c *countingSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	c.log.add("patch %s of %T %s", c.name, obj, obj.GetName())
	return c.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

type countingSubResourceClient struct {
	client.SubResourceClient
	log  *writeLog
	name string
}

func (c *countingSubResourceClient) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	c.log.add("create %s of %T %s", c.name, obj, obj.GetName())
	return c.SubResourceClient.Create(ctx, obj, sub, opts...)
}

func (c *countingSubResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	c.log.add("update %s of %T %s", c.name, obj, obj.GetName())
	return c.SubResourceClient.Update(ctx, obj, opts...)
}

func (c *countingSubResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	c.log.add("patch %s of %T %s", c.name, obj, obj.GetName())
	return c.SubResourceClient.Patch(ctx, obj, patch, opts...)
}

// countingRecorder logs every Event recorded through it.
type countingRecorder struct {
	events.EventRecorder
	log *writeLog
}

func (r *countingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.log.add("event %s %s: %s", eventtype, reason, fmt.Sprintf(note, args...))
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}
