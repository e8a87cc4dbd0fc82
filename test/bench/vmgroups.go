package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/vmware/govmomi/simulator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	vmgroupReplicas = 50
	// cloneDelay is how long vcsim takes per clone; its own clones finish at once, which would hide
	// what the clone concurrency buys.
	cloneDelay    = 200 * time.Millisecond
	benchTemplate = "ubuntu-22.04-template"
	idleResyncs   = 20
)

// vmgroupsBench runs the vmgroups controller in-process against an in-process vcsim and times a
// VmGroup of 50 replicas from creation to every VM Running, at clone concurrency 1, 4 and 8; then
// counts the vSphere calls and API requests of a reconcile that finds nothing to do (a resync).
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

	// Clones take cloneDelay without holding the template's lock meanwhile ("LockHandoff": 0), so
	// clones run side by side as in vCenter. The bench's calls do not go through Sim.Wrap: running
	// vcsim's tasks one at a time is needed only under the race detector, and would hide the
	// concurrency measured here.
	simulator.TaskDelay.MethodDelay = map[string]int{"CloneVm": int(cloneDelay.Milliseconds()), "LockHandoff": 0}
	sim, err := vsimtest.New(ctx)
	if err != nil {
		return nil, err
	}
	defer sim.Stop()
	if _, err := sim.CreateTemplate(ctx, benchTemplate); err != nil {
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
	var base float64
	for _, concurrency := range []int{1, 4, 8} {
		o := &vmgroups.Options{Secret: secretNS + "/" + secretName, Insecure: true, CloneConcurrency: concurrency,
			Resync: 5 * time.Minute, Concurrency: 4}
		run, err := vmgroupsRun(ctx, e.cluster.Config, c, o)
		if err != nil {
			return nil, fmt.Errorf("clone concurrency %d: %w", concurrency, err)
		}
		secs := run.running.Seconds()
		if concurrency == 1 {
			base = secs
		}
		// The least time possible: ⌈replicas / concurrency⌉ clone times, clones pipelined.
		batches := (vmgroupReplicas + concurrency - 1) / concurrency
		floor := float64(batches) * cloneDelay.Seconds()
		out = append(out, result{
			metric: fmt.Sprintf("%d replicas, clone concurrency %d: seconds to all Running", vmgroupReplicas, concurrency),
			value:  secs, unit: "s",
			note: fmt.Sprintf("speed-up vs concurrency 1: %.2f; %.2f× the floor %d × %s clone = %.1f s; %d clones",
				base/secs, secs/floor, batches, cloneDelay, floor, run.clones),
		})
		if concurrency == 8 {
			out = append(out,
				result{metric: "vSphere calls per idle resync", value: run.idleVSphere, unit: "calls",
					note: fmt.Sprintf("mean of %d reconciles of a Running group of %d VMs", idleResyncs, vmgroupReplicas)},
				result{metric: "API requests per idle resync", value: run.idleAPI, unit: "requests", note: "reads and writes"})
		}
	}
	return out, nil
}

type vmgroupsFigures struct {
	running     time.Duration
	clones      int
	idleVSphere float64
	idleAPI     float64
}

// vmgroupsRun starts a manager with the controller, creates a VmGroup of 50 replicas in a
// namespace of its own, waits until it is Running, measures idle reconciles, then deletes it.
func vmgroupsRun(ctx context.Context, restCfg *rest.Config, c client.Client, o *vmgroups.Options) (vmgroupsFigures, error) {
	var fig vmgroupsFigures
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
	if err := r.SetupWithManager(mgr, o.Concurrency); err != nil {
		return fig, err
	}
	stop, err := startManager(ctx, mgr, "vmgroups")
	if err != nil {
		return fig, err
	}
	defer stop()

	ns := fmt.Sprintf("bench-vmgroups-c%d", o.CloneConcurrency)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return fig, err
	}
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		// Ready when powered on: the bench's vCenter has no guests to report addresses.
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: benchTemplate, Replicas: ptr.To[int32](vmgroupReplicas),
			Readiness: computev1alpha1.ReadinessPowerState},
	}
	start := time.Now()
	if err := c.Create(ctx, vg); err != nil {
		return fig, err
	}
	key := client.ObjectKeyFromObject(vg)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, vg); err != nil {
			return false, err
		}
		st := vg.Status
		return st.Phase == computev1alpha1.PhaseRunning && st.ReadyReplicas == vmgroupReplicas && st.ObservedGeneration == vg.Generation, nil
	})
	if err != nil {
		return fig, fmt.Errorf("waiting for %d VMs Running (%s): %w", vmgroupReplicas, vg.Status.LastMessage, err)
	}
	fig.running = time.Since(start)
	fig.clones = calls.Calls()["CloneVM_Task"]

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
