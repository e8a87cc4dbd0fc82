package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
)

// failoverBench times leader failover with namespaces, iam and vmgroups at work: two manager
// processes with --leader-elect converge 200 namespace requests, 100 IAMServiceAccounts and a
// 20-VM VmGroup; the leader is killed with SIGKILL twice mid-work (a new standby started each
// time), then the last leader is stopped with SIGTERM. It reports how long the Lease took to change
// hands each time. (test/e2e's TestFailoverUnderKillAcrossControllers checks the end state is exact.)
func failoverBench(ctx context.Context, e *env) ([]result, error) {
	const ns, requestsNS, lease = "bench-failover", "bench-failover-requests", "bench-failover"
	const requests, serviceAccounts, vms = 200, 100, 20
	if err := installAllCRDs(ctx, e); err != nil {
		return nil, err
	}
	c, err := client.New(e.cluster.Config, client.Options{Scheme: manager.Scheme(iamv1alpha1.AddToScheme, computev1alpha1.AddToScheme)})
	if err != nil {
		return nil, err
	}
	out, err := startOutsideSystems(ctx, e, ns, requestsNS)
	if err != nil {
		return nil, err
	}
	defer out.stop()
	args := append(slices.Clone(out.args), "--controllers=namespaces,iam,vmgroups", "--leader-elect",
		"--leader-election-namespace="+ns, "--leader-election-id="+lease, "--vsphere-clone-concurrency=2")
	var running []*managerProcess
	defer func() {
		for _, p := range running {
			_ = p.stop()
		}
	}()
	start := func() error {
		p, err := startProcess(e, args...)
		if err == nil {
			running = append(running, p)
		}
		return err
	}
	holder := func() string {
		l := &coordinationv1.Lease{}
		if e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: lease}, l) != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	// newHolder waits for the Lease to name someone other than old, polling every 20 ms.
	newHolder := func(old string) (string, time.Time, error) {
		var now string
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			now = holder()
			return now != "" && now != old, nil
		})
		return now, time.Now(), err
	}

	if err := start(); err != nil {
		return nil, err
	}
	leaderID, _, err := newHolder("")
	if err != nil {
		return nil, fmt.Errorf("no leader: %w", err)
	}
	if err := start(); err != nil {
		return nil, err
	}

	// The work, all at once.
	if err := submitRequests(ctx, e, requestsNS, "bench-ha", requests); err != nil {
		return nil, err
	}
	if err := parallel(16, serviceAccounts, func(i int) error {
		return c.Create(ctx, &iamv1alpha1.IAMServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("sa-%03d", i)},
			Spec: iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: fmt.Sprintf("sa-%03d", i), CreateServiceAccount: true,
				ManagedPolicyArns: []string{"arn:aws:iam::aws:policy/ReadOnlyAccess"}},
		})
	}); err != nil {
		return nil, err
	}
	if err := c.Create(ctx, &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ha"},
		Spec:       computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "bench-template", Replicas: ptr.To[int32](vms)},
	}); err != nil {
		return nil, err
	}

	// progress counts what is done: requests served, roles in AWS, VMs in vCenter.
	progress := func() int {
		secrets := &corev1.SecretList{}
		_ = e.client.List(ctx, secrets, client.InNamespace(requestsNS))
		n := len(secrets.Items) + len(out.iam.State().Roles)
		if got, err := out.sim.ListVMs(ctx, "/DC0/vm/"+ns+"-ha"); err == nil {
			n += len(got)
		}
		return n
	}
	total := requests + serviceAccounts + vms
	var takeovers []float64
	for kill := range 2 {
		done := progress()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return progress() > done, nil
		}); err != nil {
			return nil, fmt.Errorf("kill %d: the leader made no progress: %w", kill+1, err)
		}
		// The leader is the oldest manager running (the Lease went to each in turn).
		victim := running[0]
		killed := time.Now()
		_ = victim.cmd.Process.Kill()
		if err := <-victim.done; err == nil {
			return nil, fmt.Errorf("kill %d: the leader exited cleanly after SIGKILL", kill+1)
		}
		running = running[1:]
		id, took, err := newHolder(leaderID)
		if err != nil {
			return nil, fmt.Errorf("kill %d: no standby took over: %w", kill+1, err)
		}
		takeovers = append(takeovers, took.Sub(killed).Seconds())
		leaderID = id
		if err := start(); err != nil {
			return nil, err
		}
	}
	doneAtKills := progress()

	if err := waitServed(ctx, e, requestsNS, requests); err != nil {
		return nil, err
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return progress() >= total, nil
	}); err != nil {
		return nil, fmt.Errorf("not converged: %d of %d", progress(), total)
	}

	// A graceful stop releases the Lease.
	stopping := time.Now()
	leader := running[0]
	running = running[1:]
	if err := leader.stop(); err != nil {
		return nil, err
	}
	_, took, err := newHolder(leaderID)
	if err != nil {
		return nil, fmt.Errorf("no standby took over after SIGTERM: %w", err)
	}
	bound := (manager.DefaultLeaseDuration + 2*manager.DefaultRetryPeriod).Seconds()
	return []result{
		{metric: "SIGKILL of the leader → standby holds the Lease, 1st", value: takeovers[0], unit: "s",
			note: fmt.Sprintf("bound: lease %s + 2 × retry %s = %.1f s", manager.DefaultLeaseDuration, manager.DefaultRetryPeriod, bound)},
		{metric: "the same, 2nd", value: takeovers[1], unit: "s", note: fmt.Sprintf("%d of %d done at the second kill", doneAtKills, total)},
		{metric: "SIGTERM of the leader → standby holds the Lease", value: took.Sub(stopping).Seconds(), unit: "s", note: "target ≤ 2 s"},
	}, nil
}
