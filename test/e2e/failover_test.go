//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmware/govmomi/event"
	vimtypes "github.com/vmware/govmomi/vim25/types"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
)

// TestFailoverUnderKillAcrossControllers runs two managers with leader election and every
// controller that talks to the outside (namespaces, iam against the IAM emulator, vmgroups against
// vcsim) while they converge 200 namespace requests, 100 IAMServiceAccounts and a 20-VM VmGroup;
// kills the leader with SIGKILL twice, each time starting a new standby; then stops the last leader
// with SIGTERM. The end state must be exact and every outside action done once: each request's
// Namespace and Secret written once, 100 roles each created once, 20 clones and no VM removed.
// The takeover times are logged (make bench reports them; no timed assertion here).
func TestFailoverUnderKillAcrossControllers(t *testing.T) {
	parallel(t, iamController, vmgroupsController)
	ctx := context.Background()
	const (
		requests = 200
		roles    = 100
		vms      = 20
		lease    = "e2e-failover"
		prefix   = "e2e-ha-"
	)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	must(t, err)

	requestsNS := newRequestsNamespace(t)
	// Every write the test must see once, watched from before the first manager starts.
	writes := watchRequestWrites(t, cs, requestsNS, prefix)

	emu, sim, env, args := outsideSystems(t, "e2e-ha")
	args = append(args, "--controllers=namespaces,iam,vmgroups", "--health-probe-bind-address=0", "--requests-namespace="+requestsNS,
		"--leader-elect", "--leader-election-namespace="+managerNamespace, "--leader-election-id="+lease,
		"--vsphere-clone-concurrency=2")
	// The emulator's counts of calls are this test's managers' only: the managers serve every
	// IAMServiceAccount of the cluster, and no other exists (a test runs the iam controller only
	// holding its lock, and leaves none behind).
	noOtherIAMObjects(t)
	managers := 0
	start := func() *process {
		managers++
		return startAs(t, "manager", managerNamespace, "quartermaster-manager", env, args...)
	}
	holder := func() string {
		l := &coordinationv1.Lease{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: lease}, l); err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: lease}})
	})
	// waitHolder polls the Lease every 20 ms until it names someone other than old, and says when.
	waitHolder := func(old string) (string, time.Time) {
		var now string
		eventually(t, "a new holder of the Lease", func() bool {
			now = holder()
			return now != "" && now != old
		})
		return now, time.Now()
	}

	leader := start()
	leaderID, _ := waitHolder("")
	standby := start()

	// The work, all at once.
	ns := newNamespace(t)
	var wg sync.WaitGroup
	created := make(chan error, requests)
	for i := range requests {
		name := fmt.Sprintf("%s%03d", prefix, i)
		leaveNamespaces(t, name)
		t.Cleanup(func() {
			_ = admin.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name}})
		})
		wg.Go(func() {
			created <- admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name}})
		})
	}
	var manifest strings.Builder
	for i := range roles {
		fmt.Fprintf(&manifest, "---\napiVersion: iam.quartermaster.dev/v1alpha1\nkind: IAMServiceAccount\nmetadata: {name: sa-%03d}\n"+
			"spec: {serviceAccountName: sa-%03d, createServiceAccount: true, managedPolicyArns: [%q]}\n", i, i, readOnlyARN)
	}
	fmt.Fprintf(&manifest, "---\napiVersion: compute.quartermaster.dev/v1alpha1\nkind: VmGroup\nmetadata: {name: ha}\n"+
		"spec: {cpu: 1, memory: 1, template: ha-template, replicas: %d}\n", vms)
	kubectlApply(t, ns, manifest.String())
	wg.Wait()
	close(created)
	for err := range created {
		must(t, err)
	}

	// progress counts what is done outside and in: served requests' Secrets, roles, VMs.
	progress := func() int {
		return writes.count("Secret") + len(emu.state(t).Roles) + len(sim.VMs(t, "/DC0/vm/"+ns+"-ha"))
	}
	total := requests + roles + vms
	killWhenBusy := func(victim *process, victimID string, after int) {
		t.Helper()
		eventually(t, "the leader to make progress", func() bool { return progress() > after })
		done := progress()
		if done >= total {
			t.Fatalf("everything converged before the kill (%d of %d): the test would prove nothing", done, total)
		}
		killed := time.Now()
		t.Logf("killing the leader (manager %s) with %d of %d done: %v", victimID, done, total, victim.kill(t))
		newID, took := waitHolder(victimID)
		t.Logf("the standby took over after %.1fs (lease %s + 2 × retry %s = %s)", took.Sub(killed).Seconds(),
			manager.DefaultLeaseDuration, manager.DefaultRetryPeriod, manager.DefaultLeaseDuration+2*manager.DefaultRetryPeriod)
		leaderID = newID
	}

	killWhenBusy(leader, leaderID, 0)
	leader, standby = standby, start()
	killWhenBusy(leader, leaderID, progress())
	leader, standby = standby, start()

	// Converged: everything exists once.
	kubectlOK(t, "wait", "-n", ns, "iamsa", "--all", "--for=condition=Ready", "--timeout=180s")
	kubectlOK(t, "wait", "-n", ns, "vg/ha", "--for=jsonpath={.status.readyReplicas}="+fmt.Sprint(vms), "--timeout=180s")
	for i := range requests {
		waitReady(t, requestsNS, fmt.Sprintf("%s%03d", prefix, i))
	}

	// A graceful stop hands over at once (the Lease is released).
	stopping := time.Now()
	leader.stop(t)
	_, took := waitHolder(leaderID)
	t.Logf("after SIGTERM the standby led within %.2fs (retry period %s, checked every 1 to 2.2 × that)",
		took.Sub(stopping).Seconds(), manager.DefaultRetryPeriod)
	_ = standby
	t.Logf("%d managers started", managers)

	t.Run("every request served once", func(t *testing.T) {
		for i := range requests {
			name := fmt.Sprintf("%s%03d", prefix, i)
			// Created once and never deleted (the manager labels and annotates it after: updates).
			if got := writes.of("Namespace/" + name); len(got) == 0 || got[0] != watch.Added ||
				slices.Contains(got[1:], watch.Added) || slices.Contains(got, watch.Deleted) {
				t.Errorf("Namespace %s: events %v, want one creation", name, got)
			}
			// A second write of the Secret would be a second token.
			if got := writes.of("Secret/" + name); !slices.Equal(got, []watch.EventType{watch.Added}) {
				t.Errorf("Secret %s: events %v, want written once", name, got)
			}
		}
	})
	t.Run("one role per IAMServiceAccount, each created once", func(t *testing.T) {
		st := emu.state(t)
		var names []string
		for _, r := range st.Roles {
			if strings.Contains(r.Name, ns) {
				names = append(names, r.Name)
			}
		}
		for i := range roles {
			if want := irsa.RoleName(ns, fmt.Sprintf("sa-%03d", i)); !slices.Contains(names, want) {
				t.Errorf("no role %s", want)
			}
		}
		if len(names) != roles || st.Calls["CreateRole"] != roles || st.Calls["DeleteRole"] != 0 {
			t.Errorf("%d roles of %s, %d CreateRole and %d DeleteRole calls; want %d, %d, 0", len(names), ns, st.Calls["CreateRole"], st.Calls["DeleteRole"], roles, roles)
		}
	})
	t.Run("20 VMs, each cloned once, none removed", func(t *testing.T) {
		if got := len(sim.VMs(t, "/DC0/vm/"+ns+"-ha")); got != vms {
			t.Errorf("%d VMs in the group's folder, want %d", got, vms)
		}
		clonedOnce(t, sim, []string{ns + "-ha"}, vms)
	})
	// The objects' finalizers served while a manager of this test runs (the standby leads now).
	deleteNamespace(t, ns)
}

// noOtherIAMObjects fails the test when the cluster holds IAMPolicies or IAMServiceAccounts it
// did not make: what the IAM emulator counts would then not be the test's alone.
func noOtherIAMObjects(t *testing.T) {
	t.Helper()
	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(iamv1alpha1.AddToScheme)})
	must(t, err)
	pols, sas := &iamv1alpha1.IAMPolicyList{}, &iamv1alpha1.IAMServiceAccountList{}
	must(t, c.List(context.Background(), pols))
	must(t, c.List(context.Background(), sas))
	var others []string
	for _, p := range pols.Items {
		others = append(others, "IAMPolicy "+p.Namespace+"/"+p.Name)
	}
	for _, sa := range sas.Items {
		others = append(others, "IAMServiceAccount "+sa.Namespace+"/"+sa.Name)
	}
	if len(others) > 0 {
		t.Fatalf("the cluster holds IAM objects of another test, which this test's managers would serve too: %s", strings.Join(others, ", "))
	}
}

// clonedOnce checks vcsim's event log: want VMs cloned into the folders, each once, and none of
// them removed.
func clonedOnce(t *testing.T, sim *vsimtest.Sim, folders []string, want int) {
	t.Helper()
	events, err := event.NewManager(sim.Admin.Client).QueryEvents(context.Background(), vimtypes.EventFilterSpec{
		EventTypeId: []string{"VmBeingClonedEvent", "VmRemovedEvent"}, MaxCount: 1000,
	})
	must(t, err)
	cloned := map[string]int{}
	for _, e := range events {
		if e, ok := e.(*vimtypes.VmBeingClonedEvent); ok && slices.Contains(folders, e.DestFolder.Name) {
			cloned[e.DestName]++
		}
	}
	for _, e := range events {
		if e, ok := e.(*vimtypes.VmRemovedEvent); ok && cloned[e.Vm.Name] > 0 {
			t.Errorf("VM %s was removed", e.Vm.Name)
		}
	}
	if len(cloned) != want {
		t.Errorf("%d VMs cloned into %v, want %d: %v", len(cloned), folders, want, cloned)
	}
	for name, n := range cloned {
		if n != 1 {
			t.Errorf("%s cloned %d times", name, n)
		}
	}
}

// outsideSystems starts the IAM emulator and vcsim (with the template ha-template) for a manager
// running namespaces, iam and vmgroups, and returns the environment (awsEnv: the AWS SDK reads its
// endpoint from it) and the flags that point it at them.
func outsideSystems(t *testing.T, name string) (*iamEmulatorProcess, *vsimtest.Sim, []string, []string) {
	ctx := context.Background()
	emu := startIAMEmulator(t)
	sim := vsimtest.Start(t)
	sim.AddTemplate(t, "ha-template")
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: managerNamespace, Name: name + "-vcenter"},
		StringData: map[string]string{"VC_HOST": sim.URL.String(), "VC_USER": sim.User, "VC_PASS": sim.Password},
	}
	must(t, admin.Create(ctx, secret))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), secret) })
	defaults := filepath.Join(t.TempDir(), "defaults.yaml")
	must(t, os.WriteFile(defaults, []byte("resourceQuota:\n  hard: {pods: \"10\"}\n"), 0o600))
	return emu, sim, awsEnv(emu), []string{"--namespace-defaults=" + defaults,
		"--cluster-name=" + iamCluster, "--oidc-issuer=" + iamIssuer, "--aws-account-id=" + iamAccount,
		"--allowed-policy-arns=" + readOnlyARN,
		"--vsphere-secret=" + managerNamespace + "/" + secret.Name, "--vsphere-insecure"}
}

// writeLog records, per Kind/name with a prefix, the watch events seen.
type writeLog struct {
	mu     sync.Mutex
	events map[string][]watch.EventType
}

func newWriteLog() *writeLog { return &writeLog{events: map[string][]watch.EventType{}} }

// watchRequestWrites logs, until the test ends, the writes of the Secrets in a requests namespace
// and of the Namespaces whose names have prefix: what serving a namespace request writes.
func watchRequestWrites(t *testing.T, cs kubernetes.Interface, requests, prefix string) *writeLog {
	t.Helper()
	ctx := context.Background()
	writes := newWriteLog()
	secrets, err := cs.CoreV1().Secrets(requests).Watch(ctx, metav1.ListOptions{})
	must(t, err)
	t.Cleanup(secrets.Stop)
	namespaces, err := cs.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{})
	must(t, err)
	t.Cleanup(namespaces.Stop)
	go writes.follow(secrets, prefix)
	go writes.follow(namespaces, prefix)
	return writes
}

func (l *writeLog) follow(w watch.Interface, prefix string) {
	for e := range w.ResultChan() {
		obj, ok := e.Object.(client.Object)
		if !ok || !strings.HasPrefix(obj.GetName(), prefix) {
			continue
		}
		kind := "Secret"
		if _, ok := obj.(*corev1.Namespace); ok {
			kind = "Namespace"
		}
		l.mu.Lock()
		l.events[kind+"/"+obj.GetName()] = append(l.events[kind+"/"+obj.GetName()], e.Type)
		l.mu.Unlock()
	}
}

func (l *writeLog) of(key string) []watch.EventType {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events[key])
}

// count is how many objects of kind were created.
func (l *writeLog) count(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k := range l.events {
		if strings.HasPrefix(k, kind+"/") {
			n++
		}
	}
	return n
}
