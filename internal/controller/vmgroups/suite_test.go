package vmgroups

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
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

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	operatorNS = "quartermaster-system"
	secretName = "vsphere"
)

// fixture is one envtest API server and one vcsim shared by every test of the package; the
// manager starts when a test first needs it, so API validation runs with no controller around.
type fixture struct {
	env    *testenv.Env
	scheme *runtime.Scheme
	c      client.Client
	sim    *vsimtest.Sim
	logs   *testenv.LogBuffer
	calls  *vsimtest.Counter       // vSphere calls of the manager's reconciler
	faults *vsimtest.Faults        // vSphere faults injected into the manager's calls
	api    *testenv.RequestCounter // API requests of the manager
	opts   *Options

	mgr     ctrl.Manager
	r       *Reconciler
	running *testenv.Running // nil until run
}

func start(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{logs: &testenv.LogBuffer{}, calls: &vsimtest.Counter{}, faults: &vsimtest.Faults{}}
	logf.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(f.logs)))
	f.env = testenv.Start(t)
	f.scheme = manager.Scheme(computev1alpha1.AddToScheme)
	c, err := client.New(f.env.Config, client.Options{Scheme: f.scheme})
	must(t, err)
	f.c = c
	f.sim = vsimtest.Start(t)
	f.sim.AddTemplate(t, "tmpl-a")
	f.sim.AddTemplate(t, "tmpl-b")

	ctx := context.Background()
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNS}}))
	f.secret(t, secretName, f.sim.Host(), f.sim.Password)

	f.opts = &Options{Secret: operatorNS + "/" + secretName, Insecure: true, CloneConcurrency: 4, MaxReplicas: 20, Resync: 2 * time.Second, Concurrency: 4}
	f.setup(t, nil)
	t.Cleanup(func() {
		f.stop(t)
		if t.Failed() {
			t.Logf("controller logs (last 20 kB):\n%s", f.logs.Tail(20000))
		}
	})
	return f
}

// setup makes a new manager with the vmgroups controller (not started); tune, if given, changes
// the reconciler's settings. Its vSphere calls are counted (f.calls) and faults can be injected
// into them (f.faults) outside the simulator's task serialization, so a held answer holds nothing
// else.
func (f *fixture) setup(t *testing.T, tune func(*Reconciler)) {
	t.Helper()
	cfg, api := testenv.Counting(f.env.Config)
	f.api = api
	var err error
	f.mgr, err = ctrl.New(cfg, ctrl.Options{
		Scheme:  f.scheme,
		Cache:   cache.Options{DefaultTransform: cache.TransformStripManagedFields()},
		Metrics: metricsserver.Options{BindAddress: "0"},
		// envtest runs several managers in one process: controller names must not collide.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	f.r, err = NewReconciler(f.mgr, f.opts)
	must(t, err)
	f.r.Connector.Wrap = vsimtest.Chain(f.calls.Wrap, f.sim.Wrap, f.faults.Wrap)
	f.r.SlowRetry = time.Second
	f.r.GuestPoll = 200 * time.Millisecond
	if tune != nil {
		tune(f.r)
	}
	must(t, f.r.SetupWithManager(f.mgr, f.opts.Concurrency))
	f.running = nil
}

// run starts the manager (once).
func (f *fixture) run() {
	if f.running == nil {
		f.running = testenv.Run(f.mgr)
	}
}

// stop stops the manager, as a process ending: its reconciles are cancelled mid-call.
func (f *fixture) stop(t *testing.T) {
	t.Helper()
	if err := f.running.Stop(); err != nil {
		t.Errorf("manager: %v", err)
	}
	f.running = nil
}

// restart stops the manager and starts a new one on the same API server and vCenter.
func (f *fixture) restart(t *testing.T) {
	t.Helper()
	f.stop(t)
	f.setup(t, nil)
	f.run()
}

// secret writes a vCenter Secret in the operator's namespace.
func (f *fixture) secret(t *testing.T, name, host, pass string) {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: operatorNS, Name: name},
		Data:       map[string][]byte{keyHost: []byte(host), keyUser: []byte(f.sim.User), keyPass: []byte(pass + "\n")},
	}
	must(t, f.c.Create(context.Background(), s))
}

// standalone is a reconciler outside the manager, for calling Reconcile directly with its own
// clients and counters.
func (f *fixture) standalone(t *testing.T, c client.Client, secret string, wrap vcenter.Wrapper) *Reconciler {
	t.Helper()
	if wrap == nil {
		wrap = f.sim.Wrap
	} else {
		wrap = vsimtest.Chain(wrap, f.sim.Wrap)
	}
	r := &Reconciler{
		Client: c, Secrets: c, Recorder: f.mgr.GetEventRecorder("quartermaster-vmgroups-test"),
		Connector: &vcenter.Connector{Wrap: wrap}, Secret: client.ObjectKey{Namespace: operatorNS, Name: secret},
		Insecure: true, CloneConcurrency: 4, Resync: f.opts.Resync, SlowRetry: time.Second, MaxReplicas: 100, GuestPoll: 200 * time.Millisecond, Reader: c,
		work: newBackground(),
	}
	t.Cleanup(func() {
		r.work.stop()
		r.Connector.Close()
	})
	return r
}

func (f *fixture) namespace(t *testing.T, name string) {
	t.Helper()
	must(t, f.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

// group creates a VmGroup.
func (f *fixture) group(t *testing.T, ns, name string, replicas, cpu, memory int32, template string) *computev1alpha1.VmGroup {
	t.Helper()
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       computev1alpha1.VmGroupSpec{CPU: cpu, Memory: memory, Template: template, Replicas: ptr.To(replicas)},
	}
	must(t, f.c.Create(context.Background(), vg))
	return vg
}

func (f *fixture) get(t *testing.T, ns, name string) *computev1alpha1.VmGroup {
	t.Helper()
	vg := &computev1alpha1.VmGroup{}
	must(t, f.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, vg))
	return vg
}

// update changes a VmGroup's spec, retrying on conflicts.
func (f *fixture) update(t *testing.T, ns, name string, change func(*computev1alpha1.VmGroupSpec)) {
	t.Helper()
	testenv.Eventually(t, "updating "+name, func() (bool, string) {
		vg := f.get(t, ns, name)
		change(&vg.Spec)
		err := f.c.Update(context.Background(), vg)
		return err == nil, testenv.ErrString(err)
	})
}

// waitRunning waits until the group is Running with n VMs for its current generation.
func (f *fixture) waitRunning(t *testing.T, ns, name string, n int32) *computev1alpha1.VmGroup {
	t.Helper()
	var vg *computev1alpha1.VmGroup
	testenv.Eventually(t, fmt.Sprintf("%s to run %d VMs", name, n), func() (bool, string) {
		vg = f.get(t, ns, name)
		st := vg.Status
		return st.Phase == computev1alpha1.PhaseRunning && st.CurrentReplicas == n && st.ReadyReplicas == n &&
				st.ObservedGeneration == vg.Generation && meta.IsStatusConditionTrue(st.Conditions, computev1alpha1.ConditionReady),
			string(st.Phase) + ": " + st.LastMessage
	})
	return vg
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// awaitWork waits, for a reconciler called directly, until the work it started in the background
// wakes the group, when anything runs.
func awaitWork(t *testing.T, r *Reconciler, key client.ObjectKey) {
	t.Helper()
	if !r.work.active(key) {
		return
	}
	select {
	case <-r.work.wake:
	case <-time.After(30 * time.Second):
		t.Fatalf("the background work of %s did not end within 30s", key)
	}
}
