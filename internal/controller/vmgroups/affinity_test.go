package vmgroups

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/vmware/govmomi/vim25/types"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testAntiAffinity: a Required group's VMs run on separate hosts of the cluster, held by a DRS rule
// each joins before it powers on (the Sim plays DRS: vcsim stores rules but never applies them);
// one member more than the cluster has hosts stays powered off and is named in the status and an
// Event; a rule changed by hand is repaired; Preferred lets the extra member run; a Required group
// in a cluster with DRS off stalls before cloning; the rule goes when antiAffinity is dropped and
// when the group is deleted. An idle resync of a group kept apart costs one vSphere call more
// than any group's (the rule's read) and writes nothing.
func testAntiAffinity(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "t-apart")
	hosts := f.sim.ClusterHosts(t)
	const folder = "/DC0/vm/t-apart-db"
	rule := "quartermaster/t-apart/db"
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-apart", Name: "db"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To(int32(hosts)),
			Readiness: computev1alpha1.ReadinessPowerState, Placement: &computev1alpha1.Placement{AntiAffinity: computev1alpha1.AntiAffinityRequired}},
	}
	must(t, f.c.Create(ctx, vg))
	got := f.waitRunning(t, "t-apart", "db", int32(hosts))
	if got.Status.AntiAffinityRule != rule {
		t.Errorf("status.antiAffinityRule = %q, want %q", got.Status.AntiAffinityRule, rule)
	}
	// apart checks that n VMs run, each on a host of its own.
	apart := func(n int) {
		t.Helper()
		placed, vms := f.sim.Hosts(t, folder), f.sim.VMs(t, folder)
		used := map[string][]string{}
		for name, vm := range vms {
			if vm.PowerState == types.VirtualMachinePowerStatePoweredOn {
				used[placed[name]] = append(used[placed[name]], name)
			}
		}
		on := 0
		for _, names := range used {
			on += len(names)
		}
		if on != n || len(used) != n {
			t.Errorf("running VMs by host: %v; want %d VMs on %d hosts", used, n, n)
		}
	}
	apart(hosts)
	wantRule := func(mandatory bool, vms ...string) {
		t.Helper()
		testenv.Eventually(t, "rule "+rule, func() (bool, string) {
			r := f.sim.AntiAffinityRule(t, rule)
			return r != nil && r.Enabled && r.Mandatory == mandatory && slices.Equal(r.VMs, vms), fmt.Sprintf("%+v", r)
		})
	}
	names := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("db-%d", i))
		}
		slices.Sort(out)
		return out
	}
	wantRule(true, names(hosts)...)
	f.waitEvent(t, vg, "AntiAffinityRuleCreated")

	// An idle resync: the folder, its VMs, the rule; no write.
	cfg, apiCalls := testenv.Counting(f.env.Config)
	c, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	vsCalls := &vsimtest.Counter{}
	r := f.standalone(t, c, secretName, vsCalls.Wrap)
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)}
	_, err = r.Reconcile(ctx, req) // logs in, resolves the cluster
	must(t, err)
	apiCalls.Reset()
	vsCalls.Reset()
	_, err = r.Reconcile(ctx, req)
	must(t, err)
	if n := apiCalls.Writes(); n != 0 {
		t.Errorf("an idle reconcile of a group kept apart wrote %d times: %v", n, apiCalls.Log())
	}
	if n := vsCalls.Total(); n > 3 {
		t.Errorf("an idle reconcile of a group kept apart made %d vSphere calls, want at most 3: %v", n, vsCalls.Calls())
	}

	// One member more than hosts: it is cloned, joins the rule, and vCenter will not run it.
	f.update(t, "t-apart", "db", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To(int32(hosts + 1)) })
	extra := fmt.Sprintf("db-%d", hosts)
	f.waitStalled(t, "t-apart", "db", "AntiAffinityUnsatisfiable", extra+" cannot be placed: placement.antiAffinity Required gives each VM of the group a host of its own")
	e := f.waitEvent(t, vg, "AntiAffinityUnsatisfiable")
	if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, extra) {
		t.Errorf("event = %s %q, want a Warning naming %s", e.Type, e.Note, extra)
	}
	if vm := f.sim.VMs(t, folder)[extra]; vm.PowerState != types.VirtualMachinePowerStatePoweredOff {
		t.Errorf("%s is %s, want poweredOff", extra, vm.PowerState)
	}
	wantRule(true, names(hosts+1)...)
	apart(hosts)

	// Scaled back, the rule follows the members.
	f.update(t, "t-apart", "db", func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To(int32(hosts)) })
	f.waitRunning(t, "t-apart", "db", int32(hosts))
	wantRule(true, names(hosts)...)

	// A rule changed by hand (a member taken out, disabled) is repaired at the next resync.
	f.sim.EditRule(t, rule, func(r *types.ClusterAntiAffinityRuleSpec) {
		r.Vm = r.Vm[1:]
		r.Enabled = types.NewBool(false)
	})
	wantRule(true, names(hosts)...)
	f.waitEvent(t, vg, "AntiAffinityRuleRepaired")

	// Preferred: the extra member runs, sharing a host.
	f.update(t, "t-apart", "db", func(s *computev1alpha1.VmGroupSpec) {
		s.Replicas = ptr.To(int32(hosts + 1))
		s.Placement.AntiAffinity = computev1alpha1.AntiAffinityPreferred
	})
	f.waitRunning(t, "t-apart", "db", int32(hosts+1))
	wantRule(false, names(hosts+1)...)

	// Required with DRS off: stalled before anything is cloned.
	f.sim.SetDRS(t, false)
	other := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t-apart", Name: "nodrs"},
		Spec: computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "tmpl-a", Replicas: ptr.To(int32(2)),
			Readiness: computev1alpha1.ReadinessPowerState, Placement: &computev1alpha1.Placement{AntiAffinity: computev1alpha1.AntiAffinityRequired}},
	}
	must(t, f.c.Create(ctx, other))
	f.waitStalled(t, "t-apart", "nodrs", "AntiAffinityUnavailable", `DRS is off in cluster "DC0_C0"`)
	if vms := f.sim.VMs(t, "/DC0/vm/t-apart-nodrs"); len(vms) != 0 {
		t.Errorf("VMs cloned while DRS is off: %v", keys(vms))
	}
	f.sim.SetDRS(t, true)
	f.waitRunning(t, "t-apart", "nodrs", 2)

	// Dropped from the spec, the rule goes.
	f.update(t, "t-apart", "db", func(s *computev1alpha1.VmGroupSpec) { s.Placement.AntiAffinity = "" })
	testenv.Eventually(t, "the rule removed", func() (bool, string) {
		got := f.get(t, "t-apart", "db")
		return f.sim.AntiAffinityRule(t, rule) == nil && got.Status.AntiAffinityRule == "", got.Status.AntiAffinityRule
	})
	f.waitEvent(t, vg, "AntiAffinityRuleRemoved")

	// Deleted, the group takes its rule along.
	otherRule := "quartermaster/t-apart/nodrs"
	if f.sim.AntiAffinityRule(t, otherRule) == nil {
		t.Fatalf("no rule %s", otherRule)
	}
	must(t, f.c.Delete(ctx, other))
	must(t, f.c.Delete(ctx, vg))
	testenv.Eventually(t, "both groups gone", func() (bool, string) {
		err1 := f.c.Get(ctx, client.ObjectKeyFromObject(other), &computev1alpha1.VmGroup{})
		err2 := f.c.Get(ctx, client.ObjectKeyFromObject(vg), &computev1alpha1.VmGroup{})
		return apierrors.IsNotFound(err1) && apierrors.IsNotFound(err2), testenv.ErrString(err1) + " " + testenv.ErrString(err2)
	})
	if r := f.sim.AntiAffinityRule(t, otherRule); r != nil {
		t.Errorf("rule %s left behind: %+v", otherRule, r)
	}
}
