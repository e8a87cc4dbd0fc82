package vmgroups

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

func TestNotConfiguredWithoutSecretFlag(t *testing.T) {
	c := Controller()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.AddFlags(fs)
	must(t, fs.Parse(nil))
	if err := c.Configured(); err == nil || !strings.Contains(err.Error(), "--vsphere-secret") {
		t.Errorf("Configured() = %v, want an error naming --vsphere-secret", err)
	}
	for _, args := range [][]string{
		{"--vsphere-secret=no-namespace"},
		{"--vsphere-secret=ns/name", "--vsphere-clone-concurrency=0"},
		{"--vsphere-secret=ns/name", "--vsphere-resync=0s"},
	} {
		c := Controller()
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		c.AddFlags(fs)
		must(t, fs.Parse(args))
		if err := c.Configured(); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	c = Controller()
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	c.AddFlags(fs)
	must(t, fs.Parse([]string{"--vsphere-secret=quartermaster-system/vsphere"}))
	must(t, c.Configured())
}

// TestVmGroups shares one API server and one vcsim between its steps, which run in order.
func TestVmGroups(t *testing.T) {
	f := start(t)
	steps := []struct {
		name string
		run  func(*testing.T, *fixture)
		// manager: the step needs the controller running (steps before the first such step run
		// without it).
		manager bool
	}{
		{"CRD validation", testValidation, false},
		{"vCenter problems show in the status", testConnectionProblems, false},
		{"create, and a reconcile that changes nothing", testCreate, true},
		{"scale up and down", testScale, true},
		{"rolling reconfigure and template change", testRolling, true},
		{"drift", testDrift, true},
		{"deletion", testDeletion, true},
		{"template missing, then appearing", testTemplateAppears, true},
		{"linked clones", testLinkedClones, true},
		{"anti-affinity", testAntiAffinity, true},
		{"static addresses from a pool", testAddressPool, true},
		{"data disks", testDataDisks, true},
		{"a VM where the folder goes", testPlacementInvalid, true},
		{"a newer spec is read between clone batches", testNewerSpecWins, true},
		{"manager restart mid scale-up and mid scale-down", testRestartMidScale, true},
		{"injected vSphere faults", testInjectedFaults, true},
		{"a cache behind the controller's own writes", testStaleCache, true},
		{"the vCenter Secret is cached and watched", testSecretWatched, true},
		{"replicas capped at admission and by the operator", testReplicasCap, true},
		{"readiness from the guest", testGuestReadiness, true},
		{"graceful guest shutdown", testGracefulShutdown, true},
		{"first-boot data through guestinfo", testFirstBoot, true},
		{"credentials never shown", testNoCredentialsShown, true},
	}
	for _, s := range steps {
		if s.manager {
			f.run()
		}
		if !t.Run(s.name, func(t *testing.T) { s.run(t, f) }) {
			return // later steps build on earlier ones
		}
	}
}

func testConnectionProblems(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-conn")
	f.secret(t, "unreachable", "127.0.0.1:1", "whatever")
	f.secret(t, "wrong-password", f.sim.Host(), "wrong-"+f.sim.Password)
	f.secret(t, "no-host", "", f.sim.Password)
	vg := f.group(t, "t-conn", "web", 1, 1, 1, "tmpl-a")
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)}

	cases := []struct {
		secret, reason, message string
		wantErr                 bool
	}{
		{secret: "missing", reason: "CredentialsUnavailable", message: "vCenter Secret quartermaster-system/missing (--vsphere-secret) not found"},
		{secret: "no-host", reason: "CredentialsUnavailable", message: "lacks VC_HOST"},
		{secret: "unreachable", reason: "VCenterUnreachable", message: "127.0.0.1:1", wantErr: true},
		{secret: "wrong-password", reason: "LoginFailed", message: "vCenter refused the user name or password of Secret quartermaster-system/wrong-password"},
	}
	for _, c := range cases {
		t.Run(c.secret, func(t *testing.T) {
			r := f.standalone(t, f.c, c.secret, nil)
			res, err := r.Reconcile(ctx, req)
			if c.wantErr != (err != nil) {
				t.Fatalf("Reconcile error = %v, want an error: %v", err, c.wantErr)
			}
			if !c.wantErr && res.RequeueAfter != r.SlowRetry {
				t.Errorf("RequeueAfter = %s, want the slow retry %s (no hot loop)", res.RequeueAfter, r.SlowRetry)
			}
			got := f.get(t, "t-conn", "web")
			ready := meta.FindStatusCondition(got.Status.Conditions, computev1alpha1.ConditionReady)
			if got.Status.Phase != computev1alpha1.PhasePending || ready == nil || ready.Status != "False" || ready.Reason != c.reason ||
				!strings.Contains(got.Status.LastMessage, c.message) {
				t.Errorf("status = %s %+v, want Pending/%s with %q", got.Status.Phase, ready, c.reason, c.message)
			}
			// A Secret a person must fix stalls the group; an unreachable vCenter is transient.
			if stalled := meta.IsStatusConditionTrue(got.Status.Conditions, computev1alpha1.ConditionStalled); stalled == c.wantErr {
				t.Errorf("Stalled = %v, want %v", stalled, !c.wantErr)
			}
			if !controllerutil.ContainsFinalizer(got, Finalizer) {
				t.Error("no finalizer before the first vCenter call")
			}
			if strings.Contains(fmt.Sprint(got.Status, err), f.sim.Password) {
				t.Error("the password shows in the status or error")
			}
		})
	}
	// Clean up before the controller runs: nothing was created in vCenter.
	must(t, f.c.Delete(ctx, vg))
	got := f.get(t, "t-conn", "web")
	controllerutil.RemoveFinalizer(got, Finalizer)
	must(t, f.c.Update(ctx, got))
}

func testCreate(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-create")
	f.group(t, "t-create", "web", 3, 2, 2, "tmpl-a")
	vg := f.waitRunning(t, "t-create", "web", 3)

	folder := "/DC0/vm/t-create-web"
	if vg.Status.Folder != folder || vg.Status.Selector != SelectorLabel+"=web" || vg.Status.DesiredReplicas != 3 ||
		vg.Status.LastMessage != "3/3 VMs ready" {
		t.Errorf("status = %+v", vg.Status)
	}
	if !controllerutil.ContainsFinalizer(vg, Finalizer) {
		t.Error("no finalizer")
	}
	if meta.FindStatusCondition(vg.Status.Conditions, computev1alpha1.ConditionReconciling) != nil ||
		meta.FindStatusCondition(vg.Status.Conditions, computev1alpha1.ConditionStalled) != nil {
		t.Errorf("conditions = %+v", vg.Status.Conditions)
	}
	vms := f.sim.VMs(t, folder)
	if len(vms) != 3 {
		t.Fatalf("VMs in %s: %v", folder, vms)
	}
	for i, st := range vg.Status.VMs {
		name := vsphere.VMName("web", i)
		vm := vms[name]
		if st.Name != name || !st.Ready || st.PowerState != "poweredOn" {
			t.Errorf("status.vms[%d] = %+v", i, st)
		}
		if vm.PowerState != "poweredOn" || vm.CPU != 2 || vm.MemoryMB != 2048 ||
			vm.ExtraConfig[vsphere.KeyGroup] != "t-create/web" || vm.ExtraConfig[vsphere.KeyTemplate] != "tmpl-a" {
			t.Errorf("VM %s = %+v", name, vm)
		}
	}
	f.waitEvent(t, vg, "VMsCreated")
	f.waitEvent(t, vg, "FolderCreated")
	f.waitEvent(t, vg, "Running")

	// A reconcile of a group that is right: no API write, at most 2 vSphere calls.
	cfg, apiCalls := testenv.Counting(f.env.Config)
	c, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	vsCalls := &vsimtest.Counter{}
	r := f.standalone(t, c, secretName, vsCalls.Wrap)
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)}
	_, err = r.Reconcile(ctx, req) // logs in
	must(t, err)
	apiCalls.Reset()
	vsCalls.Reset()
	res, err := r.Reconcile(ctx, req)
	must(t, err)
	if n := apiCalls.Writes(); n != 0 {
		t.Errorf("a reconcile that changes nothing wrote %d times: %v", n, apiCalls.Log())
	}
	if n := vsCalls.Total(); n > 2 {
		t.Errorf("a reconcile that changes nothing made %d vSphere calls, want at most 2: %v", n, vsCalls.Calls())
	}
	if res.RequeueAfter < f.opts.Resync || res.RequeueAfter > f.opts.Resync*11/10 {
		t.Errorf("RequeueAfter = %s, want the jittered resync %s", res.RequeueAfter, f.opts.Resync)
	}
}

func testScale(t *testing.T, f *fixture) {
	ctx := context.Background()
	vg := f.get(t, "t-create", "web")
	// kubectl scale goes through the scale subresource.
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 5}}
	must(t, f.c.SubResource("scale").Update(ctx, vg, client.WithSubResourceBody(scale)))
	f.waitRunning(t, "t-create", "web", 5)
	if names := keys(f.sim.VMs(t, "/DC0/vm/t-create-web")); names != "web-0,web-1,web-2,web-3,web-4" {
		t.Errorf("VMs after scale up: %s", names)
	}

	f.update(t, "t-create", "web", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](2) })
	vg = f.waitRunning(t, "t-create", "web", 2)
	if names := keys(f.sim.VMs(t, "/DC0/vm/t-create-web")); names != "web-0,web-1" {
		t.Errorf("VMs after scale down: %s (the highest ordinals go first)", names)
	}
	got := &autoscalingv1.Scale{}
	must(t, f.c.SubResource("scale").Get(ctx, vg, got))
	if got.Spec.Replicas != 2 || got.Status.Replicas != 2 || got.Status.Selector != SelectorLabel+"=web" {
		t.Errorf("scale = %+v", got)
	}
	f.waitEvent(t, vg, "VMsDeleted")

	// Members named in the delete-first annotation go first; a name that is no member is said.
	scale = &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 4}}
	must(t, f.c.SubResource("scale").Update(ctx, f.get(t, "t-create", "web"), client.WithSubResourceBody(scale)))
	vg = f.waitRunning(t, "t-create", "web", 4)
	patch := client.MergeFrom(vg.DeepCopy())
	vg.Annotations = map[string]string{computev1alpha1.AnnotationDeleteFirst: "web-3, web-1,web-9"}
	must(t, f.c.Patch(ctx, vg, patch))
	scale = &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 2}}
	must(t, f.c.SubResource("scale").Update(ctx, f.get(t, "t-create", "web"), client.WithSubResourceBody(scale)))
	vg = f.waitRunning(t, "t-create", "web", 2)
	if names := keys(f.sim.VMs(t, "/DC0/vm/t-create-web")); names != "web-0,web-2" {
		t.Errorf("VMs after a scale down naming web-3 and web-1 first: %s", names)
	}
	if e := f.waitEvent(t, vg, "DeleteFirstIgnored"); e.Note != computev1alpha1.AnnotationDeleteFirst+" names web-9, which are not members of the group: ignored" {
		t.Errorf("DeleteFirstIgnored note %q", e.Note)
	}
}

// availability samples a folder's VMs while a change rolls and records the most VMs of the group
// unavailable (missing or not powered on) at once.
type availability struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	worst int
	seen  int
}

func watchAvailability(f *fixture, folder string, names []string) *availability {
	a := &availability{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for {
			select {
			case <-a.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			vms, err := f.sim.ListVMs(context.Background(), folder)
			if err != nil {
				continue
			}
			down := 0
			for _, n := range names {
				if vm, ok := vms[n]; !ok || vm.PowerState != "poweredOn" {
					down++
				}
			}
			a.mu.Lock()
			a.worst, a.seen = max(a.worst, down), a.seen+1
			a.mu.Unlock()
		}
	}()
	return a
}

func (a *availability) result() (worst, samples int) {
	close(a.stop)
	<-a.done
	return a.worst, a.seen
}

func testRolling(t *testing.T, f *fixture) {
	f.namespace(t, "t-roll")
	vg := f.group(t, "t-roll", "app", 3, 1, 1, "tmpl-a")
	f.waitRunning(t, "t-roll", "app", 3)
	folder := "/DC0/vm/t-roll-app"
	names := []string{"app-0", "app-1", "app-2"}

	watch := watchAvailability(f, folder, names)
	f.update(t, "t-roll", "app", func(s *computev1alpha1.VmGroupSpec) { s.CPU, s.Memory = 2, 3 })
	testenv.Eventually(t, "every VM reconfigured", func() (bool, string) {
		vms, err := f.sim.ListVMs(context.Background(), folder)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range names {
			if vms[n].CPU != 2 || vms[n].MemoryMB != 3072 {
				return false, fmt.Sprintf("%s: %+v", n, vms[n])
			}
		}
		return true, ""
	})
	f.waitRunning(t, "t-roll", "app", 3)
	if worst, samples := watch.result(); worst > 1 {
		t.Errorf("%d VMs were unavailable at once during the reconfigure (%d samples)", worst, samples)
	} else {
		t.Logf("reconfigure: at most %d VM unavailable in %d samples", worst, samples)
	}
	reconfigured := 0
	for _, e := range f.events(t, vg) {
		if e.Reason == "VMReconfigured" {
			reconfigured++
		}
	}
	if reconfigured != 3 {
		t.Errorf("%d VMReconfigured events, want 3 (one per VM)", reconfigured)
	}

	watch = watchAvailability(f, folder, names)
	f.update(t, "t-roll", "app", func(s *computev1alpha1.VmGroupSpec) { s.Template = "tmpl-b" })
	testenv.Eventually(t, "every VM replaced", func() (bool, string) {
		vms, err := f.sim.ListVMs(context.Background(), folder)
		if err != nil {
			return false, err.Error()
		}
		for _, n := range names {
			if vms[n].ExtraConfig[vsphere.KeyTemplate] != "tmpl-b" {
				return false, fmt.Sprintf("%s: %+v", n, vms[n])
			}
		}
		return len(vms) == 3, keys(vms)
	})
	f.waitRunning(t, "t-roll", "app", 3)
	if worst, samples := watch.result(); worst > 1 {
		t.Errorf("%d VMs were unavailable at once during the template change (%d samples)", worst, samples)
	} else {
		t.Logf("template change: at most %d VM unavailable in %d samples", worst, samples)
	}
	for n, vm := range f.sim.VMs(t, folder) {
		if vm.CPU != 2 || vm.MemoryMB != 3072 || vm.PowerState != "poweredOn" {
			t.Errorf("replaced VM %s = %+v", n, vm)
		}
	}
	f.waitEvent(t, vg, "VMReplaced")
}

func testDrift(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-drift")
	vg := f.group(t, "t-drift", "db", 3, 1, 1, "tmpl-a")
	f.waitRunning(t, "t-drift", "db", 3)
	folder := "/DC0/vm/t-drift-db"

	f.sim.PowerOff(t, folder+"/db-1")
	testenv.Eventually(t, "db-1 powered on again", func() (bool, string) {
		vms, _ := f.sim.ListVMs(context.Background(), folder)
		vm := vms["db-1"]
		return vm.PowerState == "poweredOn", string(vm.PowerState)
	})
	f.waitEvent(t, vg, "VMsPoweredOn")

	f.sim.Destroy(t, folder+"/db-2")
	testenv.Eventually(t, "db-2 re-created", func() (bool, string) {
		vms, _ := f.sim.ListVMs(context.Background(), folder)
		return vms["db-2"].PowerState == "poweredOn", keys(vms)
	})

	// VMs someone else put in the folder are reported and left alone; their names are not reused.
	f.sim.AddVM(t, folder, "hand-made")
	f.sim.AddVM(t, folder, "db-4")
	testenv.Eventually(t, "the hand-made VMs reported", func() (bool, string) {
		st := f.get(t, "t-drift", "db").Status
		return strings.Join(st.UnmanagedVMs, ",") == "db-4,hand-made" && strings.Contains(st.LastMessage, "not created by Quartermaster"),
			st.LastMessage
	})
	f.waitEvent(t, vg, "UnmanagedVMs")
	f.update(t, "t-drift", "db", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](5) })
	vg = f.waitRunning(t, "t-drift", "db", 5)
	var members []string
	for _, vm := range vg.Status.VMs {
		members = append(members, vm.Name)
	}
	if got := strings.Join(members, ","); got != "db-0,db-1,db-2,db-3,db-5" {
		t.Errorf("members = %s, want db-4 skipped", got)
	}

	// Deleting the group keeps the hand-made VMs and so the folder.
	must(t, f.c.Delete(ctx, vg))
	testenv.Eventually(t, "the VmGroup gone", func() (bool, string) {
		err := f.c.Get(ctx, client.ObjectKeyFromObject(vg), &computev1alpha1.VmGroup{})
		return apierrors.IsNotFound(err), testenv.ErrString(err)
	})
	if got := keys(f.sim.VMs(t, folder)); got != "db-4,hand-made" {
		t.Errorf("VMs left in the folder: %s, want only the hand-made ones", got)
	}
	f.waitEvent(t, vg, "FolderKept")
}

func testDeletion(t *testing.T, f *fixture) {
	ctx := context.Background()
	vg := f.get(t, "t-roll", "app")
	// One VM already gone out of band is not an error.
	f.sim.Destroy(t, "/DC0/vm/t-roll-app/app-0")
	must(t, f.c.Delete(ctx, vg))
	testenv.Eventually(t, "the VmGroup gone", func() (bool, string) {
		err := f.c.Get(ctx, client.ObjectKeyFromObject(vg), &computev1alpha1.VmGroup{})
		return apierrors.IsNotFound(err), testenv.ErrString(err)
	})
	if f.sim.Exists(t, "/DC0/vm/t-roll-app") {
		t.Errorf("folder left behind with %s", keys(f.sim.VMs(t, "/DC0/vm/t-roll-app")))
	}
}

func testTemplateAppears(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-late")
	vg := f.group(t, "t-late", "late", 2, 1, 1, "tmpl-late")
	testenv.Eventually(t, "the Error phase", func() (bool, string) {
		vg = f.get(t, "t-late", "late")
		ready := meta.FindStatusCondition(vg.Status.Conditions, computev1alpha1.ConditionReady)
		return vg.Status.Phase == computev1alpha1.PhaseError && ready != nil && ready.Status == "False" &&
				ready.Reason == "TemplateNotFound" && meta.IsStatusConditionTrue(vg.Status.Conditions, computev1alpha1.ConditionStalled),
			vg.Status.LastMessage
	})
	if !strings.Contains(vg.Status.LastMessage, `template "tmpl-late" not found`) {
		t.Errorf("message = %q", vg.Status.LastMessage)
	}
	e := f.waitEvent(t, vg, "TemplateNotFound")
	if e.Type != corev1.EventTypeWarning {
		t.Errorf("event type = %s", e.Type)
	}
	// Retried slowly, not in a hot loop.
	r := f.standalone(t, f.c, secretName, nil)
	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)})
	if err != nil || res.RequeueAfter != r.SlowRetry {
		t.Errorf("Reconcile = %+v, %v; want a slow retry without error", res, err)
	}

	f.sim.AddTemplate(t, "tmpl-late")
	f.waitRunning(t, "t-late", "late", 2)
}

func testNewerSpecWins(t *testing.T, f *fixture) {
	f.namespace(t, "t-burst")
	f.group(t, "t-burst", "burst", 5, 1, 1, "tmpl-a")
	f.waitRunning(t, "t-burst", "burst", 5)
	before := f.calls.Calls()["CloneVM_Task"]

	f.update(t, "t-burst", "burst", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](20) })
	testenv.Eventually(t, "the first batch", func() (bool, string) {
		n := f.calls.Calls()["CloneVM_Task"] - before
		return n > 0, fmt.Sprint(n)
	})
	f.update(t, "t-burst", "burst", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](3) })
	f.waitRunning(t, "t-burst", "burst", 3)
	if n := f.calls.Calls()["CloneVM_Task"] - before; n >= 15 {
		t.Errorf("%d clones for 5 → 20 → 3: the newer spec was not read between batches", n)
	} else {
		t.Logf("%d clones for 5 → 20 → 3 (batches of %d)", n, f.opts.CloneConcurrency)
	}
	if got := keys(f.sim.VMs(t, "/DC0/vm/t-burst-burst")); got != "burst-0,burst-1,burst-2" {
		t.Errorf("VMs = %s", got)
	}
}

func testNoCredentialsShown(t *testing.T, f *fixture) {
	ctx := context.Background()
	pw := f.sim.Password
	if strings.Contains(f.logs.String(), pw) {
		t.Error("the vCenter password shows in the logs")
	}
	list := &computev1alpha1.VmGroupList{}
	must(t, f.c.List(ctx, list))
	for _, vg := range list.Items {
		if strings.Contains(fmt.Sprintf("%+v", vg.Status), pw) {
			t.Errorf("the password shows in the status of %s/%s", vg.Namespace, vg.Name)
		}
	}
	events := &corev1.EventList{}
	must(t, f.c.List(ctx, events))
	for _, e := range events.Items {
		if strings.Contains(e.Message, pw) {
			t.Errorf("the password shows in an Event: %s", e.Message)
		}
	}
	if len(list.Items) == 0 || len(events.Items) == 0 {
		t.Error("nothing to check")
	}
}

// keys lists a map's names sorted, numbers in names by value ("x-9" before "x-10").
func keys[V any](m map[string]V) string {
	out := slices.Collect(maps.Keys(m))
	slices.SortFunc(out, func(a, b string) int {
		pa, na, okA := cutOrdinal(a)
		pb, nb, okB := cutOrdinal(b)
		if okA && okB && pa == pb {
			return cmp.Compare(na, nb)
		}
		return strings.Compare(a, b)
	})
	return strings.Join(out, ",")
}

func cutOrdinal(name string) (string, int, bool) {
	i := strings.LastIndex(name, "-")
	if i < 0 {
		return name, 0, false
	}
	n, err := strconv.Atoi(name[i+1:])
	return name[:i], n, err == nil
}

// testLinkedClones: a group of linked clones on a template without a snapshot stalls, saying what
// to do; once the template has one, its VMs are linked clones of it (the Sim's vCenter checks the
// snapshot is the template's); a named snapshot that is not there stalls the next clone.
func testLinkedClones(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-linked")
	f.sim.AddTemplate(t, "tmpl-linked")
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-linked", Name: "fast"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-linked", Replicas: ptr.To[int32](2),
			CloneMode: computev1alpha1.CloneModeLinked, Readiness: computev1alpha1.ReadinessPowerState},
	}
	must(t, f.c.Create(ctx, vg))
	f.waitStalled(t, "t-linked", "fast", "TemplateInvalid", `template "tmpl-linked": has no snapshot: a linked clone (cloneMode: Linked) is made from a snapshot of its template`)

	_, linkedBefore := f.sim.Clones()
	f.sim.AddSnapshot(t, "tmpl-linked", "base")
	f.waitRunning(t, "t-linked", "fast", 2)
	if _, linked := f.sim.Clones(); linked-linkedBefore != 2 {
		t.Errorf("%d linked clones, want 2", linked-linkedBefore)
	}

	f.update(t, "t-linked", "fast", func(s *computev1alpha1.VmGroupSpec) { s.Snapshot = "gone"; s.Replicas = ptr.To[int32](3) })
	f.waitStalled(t, "t-linked", "fast", "TemplateInvalid", `has no snapshot named "gone" (it has "base")`)
	f.update(t, "t-linked", "fast", func(s *computev1alpha1.VmGroupSpec) { s.Snapshot = "base" })
	f.waitRunning(t, "t-linked", "fast", 3)

	// A new named snapshot replaces the members made from the old one, one at a time.
	f.sim.AddSnapshot(t, "tmpl-linked", "v2")
	_, before := f.sim.Clones()
	f.update(t, "t-linked", "fast", func(s *computev1alpha1.VmGroupSpec) { s.Snapshot = "v2" })
	testenv.Eventually(t, "every member a linked clone of v2", func() (bool, string) {
		// Listed while VMs are replaced: one destroyed between the folder's read and its own is
		// an answer to look again at, not a failure.
		vms, err := f.sim.ListVMs(context.Background(), "/DC0/vm/t-linked-fast")
		if err != nil {
			return false, err.Error()
		}
		var marks []string
		for _, name := range []string{"fast-0", "fast-1", "fast-2"} {
			marks = append(marks, vms[name].ExtraConfig[vsphere.KeySnapshot])
		}
		return strings.Join(marks, ",") == "v2,v2,v2", strings.Join(marks, ",")
	})
	f.waitRunning(t, "t-linked", "fast", 3)
	if _, linked := f.sim.Clones(); linked-before != 3 {
		t.Errorf("%d linked clones for the new snapshot, want 3", linked-before)
	}
	e := f.waitEvent(t, vg, "VMReplaced")
	if !strings.Contains(e.Note, `linked clone of snapshot "base" → "v2"`) {
		t.Errorf("VMReplaced note %q", e.Note)
	}
}
