package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/simulator"
	vmtypes "github.com/vmware/govmomi/vim25/types"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/controller/vmgroups"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	benchTemplate = "ubuntu-22.04-template"
	idleResyncs   = 20
	// defaultCloneConcurrency is --vsphere-clone-concurrency's default.
	defaultCloneConcurrency = 4
)

// vmgroupsCase is one timed scaling of a VmGroup.
type vmgroupsCase struct {
	name     string
	from, to int32 // replicas: the group is created with from (and waited for), then scaled to
	// cloneDelay is how long vcsim takes per clone (0: at once, vcsim's own behaviour). Delayed
	// clones are also timed by the simplest client (bareClones).
	cloneDelay time.Duration
	// latency is added to every vSphere call, as a slow link to vCenter would.
	latency time.Duration
	// kindDelays, when set, make each clone take its kind's time (full or linked), and linked
	// clones the group's mode.
	kindDelays  *vsimtest.CloneDelays
	linked      bool
	concurrency int // --vsphere-clone-concurrency
	note        func(fig vmgroupsFigures) string
}

// vmgroupsCases: the first two are the simplest peer's own measurements (codeconnect-vm-operator,
// on the same simulator: 3 → 20 in 1.1 s with instant clones; 0 → 20 in 5.6 s with 50 ms added to
// every call); the others show what clone concurrency buys when clones take time, against the floor
// of ⌈replicas / concurrency⌉ clone times, pipelined.
func vmgroupsCases() []vmgroupsCase {
	peer := func(target string) func(vmgroupsFigures) string {
		return func(fig vmgroupsFigures) string {
			return fmt.Sprintf("target %s; %d clones, %d vSphere calls", target, fig.clones, fig.calls)
		}
	}
	cs := []vmgroupsCase{
		{name: "instant clones, 3 → 20, defaults", from: 3, to: 20, concurrency: defaultCloneConcurrency,
			note: peer("≤ 1.1 s (the simplest peer's time)")},
		{name: "50 ms per vSphere call, 0 → 20, defaults", to: 20, latency: 50 * time.Millisecond,
			concurrency: defaultCloneConcurrency, note: peer("≤ 4.5 s (the simplest peer: 5.6 s)")},
	}
	// Linked against full clones, 3 → 20: the clones take the ratio of a real full and linked
	// clone's times. The figures: a linked clone 5-10 s, a full clone 90-180 s (puppetlabs/vmpooler
	// #333, its maintainer on their vSphere, 2019): the midpoints 7.5 s and 135 s, ratio 18, here
	// scaled to 50 ms and 900 ms.
	delays := &vsimtest.CloneDelays{Full: 900 * time.Millisecond, Linked: 50 * time.Millisecond}
	var full float64
	cs = append(cs,
		vmgroupsCase{name: "full clones of 900 ms, 3 → 20, defaults", from: 3, to: 20, kindDelays: delays, concurrency: defaultCloneConcurrency,
			note: func(fig vmgroupsFigures) string {
				full = fig.running.Seconds()
				return fmt.Sprintf("%.2f× the floor 5 × 900 ms = 4.5 s; a full clone takes 18× a linked one (vmpooler's figures); %d clones", full/4.5, fig.clones)
			}},
		vmgroupsCase{name: "linked clones of 50 ms, 3 → 20, defaults", from: 3, to: 20, kindDelays: delays, linked: true, concurrency: defaultCloneConcurrency,
			note: func(fig vmgroupsFigures) string {
				return fmt.Sprintf("%.1f× faster than the full clones of the case above; %d clones", full/fig.running.Seconds(), fig.clones)
			}},
	)
	const replicas, clone = 50, 200 * time.Millisecond
	var base float64
	for _, concurrency := range []int{1, 4, 8} {
		batches := (replicas + concurrency - 1) / concurrency
		floor := float64(batches) * clone.Seconds()
		cs = append(cs, vmgroupsCase{
			name: fmt.Sprintf("%d replicas, %s clones, clone concurrency %d", replicas, clone, concurrency),
			to:   replicas, cloneDelay: clone, concurrency: concurrency,
			note: func(fig vmgroupsFigures) string {
				secs := fig.running.Seconds()
				if concurrency == 1 {
					base = secs
				}
				return fmt.Sprintf("%.2f× the floor %d × %s = %.1f s (target at 8: ≤ 1.3×); a bare govmomi loop of the same clones: %.2f s (%.2f× the floor); speed-up vs concurrency 1: %.2f; %d clones",
					secs/floor, batches, clone, floor, fig.bare.Seconds(), fig.bare.Seconds()/floor, base/secs, fig.clones)
			},
		})
	}
	return cs
}

// vmgroupsBench runs the vmgroups controller in-process against an in-process vcsim and times
// VmGroups from a change of replicas to every VM Running (vmgroupsCases); then counts the vSphere
// calls and API requests of a reconcile that finds nothing to do (a resync).
func vmgroupsBench(ctx context.Context, e *env) ([]result, error) {
	scheme := manager.Scheme(computev1alpha1.AddToScheme)
	c, err := client.New(e.cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	crd := filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "compute.quartermaster.dev_vmgroups.yaml")
	if _, err := e.cluster.Kubectl(ctx, "apply", "--server-side", "-f", crd); err != nil {
		return nil, err
	}
	if err := waitEstablished(ctx, e); err != nil {
		return nil, err
	}

	// The bench's calls do not go through Sim.Wrap: running vcsim's tasks one at a time is needed
	// only under the race detector, and would hide the concurrency measured here.
	sim, err := vsimtest.New(ctx)
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	defer func() { simulator.TaskDelay.MethodDelay = nil }()
	if _, err := sim.CreateTemplate(ctx, benchTemplate); err != nil {
		return nil, err
	}
	if err := sim.CreateSnapshot(ctx, benchTemplate, "base"); err != nil { // for linked clones
		return nil, err
	}
	const secretNS, secretName = "quartermaster-system", "vcenter"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretNS, Name: secretName}, StringData: map[string]string{
		"VC_HOST": sim.Host(), "VC_USER": sim.User, "VC_PASS": sim.Password,
	}}
	if err := c.Create(ctx, secret); err != nil {
		return nil, err
	}

	var out []result
	var fig vmgroupsFigures
	for i, bc := range vmgroupsCases() {
		// Clones take cloneDelay without holding the template's lock meanwhile ("LockHandoff": 0),
		// so clones run side by side as in vCenter.
		simulator.TaskDelay.MethodDelay = map[string]int{"CloneVm": int(bc.cloneDelay.Milliseconds()), "LockHandoff": 0}
		o := &vmgroups.Options{Secret: secretNS + "/" + secretName, Insecure: true, CloneConcurrency: bc.concurrency,
			Resync: 5 * time.Minute, Concurrency: 4}
		fig, err = vmgroupsRun(ctx, e.cluster.Config, c, o, bc, fmt.Sprintf("bench-vmgroups-%d", i))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", bc.name, err)
		}
		if bc.cloneDelay > 0 {
			if fig.bare, err = bareClones(ctx, sim, fmt.Sprintf("bench-bare-%d", i), int(bc.to), bc.concurrency); err != nil {
				return nil, fmt.Errorf("%s, bare clones: %w", bc.name, err)
			}
		}
		out = append(out, result{metric: bc.name + ": seconds to all Running", value: fig.running.Seconds(), unit: "s", note: bc.note(fig)})
	}
	// The last case's group: 50 Running VMs.
	out = append(out,
		result{metric: "vSphere calls per idle resync", value: fig.idleVSphere, unit: "calls",
			note: fmt.Sprintf("mean of %d reconciles of a Running group of %d VMs", idleResyncs, fig.replicas)},
		result{metric: "API requests per idle resync", value: fig.idleAPI, unit: "requests", note: "reads and writes"})
	return out, nil
}

type vmgroupsFigures struct {
	running     time.Duration // from the change of replicas to every VM Running
	replicas    int32
	clones      int           // CloneVM_Task calls while timed
	calls       int           // vSphere calls while timed
	bare        time.Duration // bareClones of the same VMs
	idleVSphere float64
	idleAPI     float64
}

// vmgroupsRun starts a manager with the controller, creates a VmGroup of bc.from replicas in a
// namespace of its own and waits for it, times the scaling to bc.to replicas,
// measures idle reconciles, then deletes the group.
func vmgroupsRun(ctx context.Context, restCfg *rest.Config, c client.Client, o *vmgroups.Options, bc vmgroupsCase, ns string) (vmgroupsFigures, error) {
	fig := vmgroupsFigures{replicas: bc.to}
	cfg, api := testenv.Counting(restCfg)
	mgr, err := newManager(cfg, ctrl.Options{Scheme: c.Scheme()})
	if err != nil {
		return fig, err
	}
	r, err := vmgroups.NewReconciler(mgr, o)
	if err != nil {
		return fig, err
	}
	calls := &vsimtest.Counter{}
	r.Connector.Wrap = calls.Wrap
	if bc.latency > 0 {
		r.Connector.Wrap = vsimtest.Chain(vsimtest.Latency(bc.latency).Wrap, calls.Wrap)
	}
	if bc.kindDelays != nil {
		r.Connector.Wrap = vsimtest.Chain(bc.kindDelays.Wrap, calls.Wrap)
	}
	if err := r.SetupWithManager(mgr, o.Concurrency); err != nil {
		return fig, err
	}
	stop, err := startManager(ctx, mgr, "vmgroups")
	if err != nil {
		return fig, err
	}
	defer stop()

	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return fig, err
	}
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		// Ready when powered on: the bench's vCenter has no guests to report addresses.
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: benchTemplate, Replicas: ptr.To(bc.from),
			Readiness: computev1alpha1.ReadinessPowerState},
	}
	if bc.linked {
		vg.Spec.CloneMode = computev1alpha1.CloneModeLinked // of the template's snapshot
	}
	key := client.ObjectKeyFromObject(vg)
	running := func(replicas int32) error {
		return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, key, vg); err != nil {
				return false, err
			}
			st := vg.Status
			return st.Phase == computev1alpha1.PhaseRunning && st.ReadyReplicas == replicas && st.ObservedGeneration == vg.Generation, nil
		})
	}
	// The group is settled at bc.from first (0 too: by then the manager runs and is logged in), so
	// the time is the scaling's alone, as the peer's figures are.
	if err := c.Create(ctx, vg); err != nil {
		return fig, err
	}
	if err := running(bc.from); err != nil {
		return fig, fmt.Errorf("waiting for %d VMs Running (%s): %w", bc.from, vg.Status.LastMessage, err)
	}
	calls.Reset()
	start := time.Now()
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, bc.to))
	if err := c.Patch(ctx, vg, patch); err != nil {
		return fig, err
	}
	if err := running(bc.to); err != nil {
		return fig, fmt.Errorf("waiting for %d VMs Running (%s): %w", bc.to, vg.Status.LastMessage, err)
	}
	fig.running = time.Since(start)
	fig.clones = calls.Calls()["CloneVM_Task"]
	fig.calls = calls.Total()

	// Idle resyncs: the same reconcile the resync timer runs, called directly so it is counted alone
	// (the group's own resync is 5 minutes away).
	calls.Reset()
	api.Reset()
	for range idleResyncs {
		res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key})
		if err != nil {
			return fig, fmt.Errorf("an idle reconcile: %w", err)
		}
		if res.RequeueAfter < o.Resync {
			return fig, fmt.Errorf("an idle reconcile acted: %+v (%s)", res, vg.Status.LastMessage)
		}
	}
	fig.idleVSphere = float64(calls.Total()) / idleResyncs
	fig.idleAPI = float64(api.Total()) / idleResyncs

	if err := c.Delete(ctx, vg); err != nil {
		return fig, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, key, &computev1alpha1.VmGroup{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	return fig, err
}

// bareClones is the simplest client of the same vCenter: workers goroutines cloning the bench's
// template n times, powered on, each clone waited for as govmomi waits for a task; no listing, no
// status. Its time is what vcsim itself costs beyond the clone delay (its task polls, its
// property collector's 20 ms tick).
func bareClones(ctx context.Context, sim *vsimtest.Sim, folderName string, n, workers int) (time.Duration, error) {
	u := *sim.URL
	u.User = url.UserPassword(sim.User, sim.Password)
	c, err := govmomi.NewClient(ctx, &u, true)
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Logout(context.WithoutCancel(ctx)) }()
	f := find.NewFinder(c.Client)
	dc, err := f.Datacenter(ctx, vsimtest.Datacenter)
	if err != nil {
		return 0, err
	}
	f.SetDatacenter(dc)
	template, err := f.VirtualMachine(ctx, benchTemplate)
	if err != nil {
		return 0, err
	}
	pool, err := f.DefaultResourcePool(ctx)
	if err != nil {
		return 0, err
	}
	root, err := f.Folder(ctx, vsimtest.VMFolder)
	if err != nil {
		return 0, err
	}
	folder, err := root.CreateFolder(ctx, folderName)
	if err != nil {
		return 0, err
	}
	poolRef := pool.Reference()
	names := make(chan string, n)
	for i := range n {
		names <- fmt.Sprintf("%s-%d", folderName, i)
	}
	close(names)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for range workers {
		g.Go(func() error {
			for name := range names {
				task, err := template.Clone(gctx, folder, name, vmtypes.VirtualMachineCloneSpec{
					Location: vmtypes.VirtualMachineRelocateSpec{Pool: &poolRef}, PowerOn: true,
				})
				if err != nil {
					return err
				}
				if _, err := task.WaitForResult(gctx); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err = g.Wait()
	return time.Since(start), err
}
