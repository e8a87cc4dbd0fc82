package vmgroups

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"

	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
)

// testInjectedFaults runs a group through a flaky vCenter and through an outage: the end state is
// exact, the errors show in the status and Events, retries back off, and the group recovers by
// itself when vCenter does.
func testInjectedFaults(t *testing.T, f *fixture) {
	const ns, name, folder = "t-fault", "web", "/DC0/vm/t-fault-web"
	f.namespace(t, ns)
	clones := f.calls.Calls()["CloneVM_Task"]

	// A flaky vCenter: one call in four fails, refused or with its answer lost (the call was
	// carried out), while the group's 8 VMs are made.
	f.faults.Set(&vsimtest.Rule{Kinds: []vsimtest.Kind{vsimtest.SOAPFault, vsimtest.Reset}, Fraction: 0.25})
	vg := f.group(t, ns, name, 8, 1, 1, "tmpl-a")
	testenv.Eventually(t, "the faults reported", func() (bool, string) {
		reasons := f.warnings(t, vg)
		return f.faults.Injected() >= 6 && (slices.Contains(reasons, "VCenterError") || slices.Contains(reasons, "VCenterUnreachable")),
			fmt.Sprintf("%d faults, Warning Events %v", f.faults.Injected(), reasons)
	})
	t.Logf("%d faults injected, Warning Events %v", f.faults.Injected(), f.warnings(t, vg))
	f.faults.Set(nil)
	f.waitRunning(t, ns, name, 8)
	f.checkFolder(t, folder, 8)
	f.checkClones(t, clones, 8)

	// An outage of the group's folder lookups (the first call of every attempt): refused, then
	// unreachable. Each attempt makes exactly one such call, so the injected faults count them.
	lookup := func(_ string, req soap.HasFault) bool {
		b, ok := req.(*methods.FindByInventoryPathBody)
		return ok && b.Req.InventoryPath == folder
	}
	f.faults.Set(&vsimtest.Rule{Match: lookup, Fraction: 1})
	begin := time.Now()
	f.update(t, ns, name, func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](10) })
	f.waitFailing(t, ns, name, "VCenterError", vsimtest.InjectedMessage)
	testenv.Eventually(t, "three attempts", func() (bool, string) { return f.faults.Injected() >= 3, fmt.Sprint(f.faults.Injected()) })
	// The backoff doubles from 1 s: n attempts take at least 2^(n-1)-1 s, plus one resync that was
	// already due. A hot loop would make hundreds.
	attempts, elapsed := f.faults.Injected(), time.Since(begin)
	if limit := 2 + int(math.Log2(elapsed.Seconds()+1)); attempts > limit {
		t.Errorf("%d attempts in %s during an outage, want at most %d (backoff from 1 s)", attempts, elapsed, limit)
	} else {
		t.Logf("%d attempts in %s during the outage", attempts, elapsed.Round(time.Millisecond))
	}

	f.faults.Set(&vsimtest.Rule{Kinds: []vsimtest.Kind{vsimtest.Reset}, Match: lookup, Fraction: 1})
	f.waitFailing(t, ns, name, "VCenterUnreachable", "connection reset")
	f.faults.Set(nil)
	vg = f.waitRunning(t, ns, name, 10)
	f.checkFolder(t, folder, 10)
	f.checkClones(t, clones, 10)
	for _, reason := range []string{"VCenterError", "VCenterUnreachable"} {
		if !slices.Contains(f.warnings(t, vg), reason) {
			t.Errorf("no Warning Event %s", reason)
		}
	}
}

// waitFailing waits until the group shows a transient vCenter failure: Pending, not Ready for the
// reason, Reconciling (retried with backoff), not Stalled (no person needed).
func (f *fixture) waitFailing(t *testing.T, ns, name, reason, message string) {
	t.Helper()
	testenv.Eventually(t, name+" "+reason, func() (bool, string) {
		vg := f.get(t, ns, name)
		st := vg.Status
		ready := meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionReady)
		return st.Phase == computev1alpha1.PhasePending && ready != nil && ready.Status == "False" && ready.Reason == reason &&
				strings.Contains(st.LastMessage, message) && st.ObservedGeneration == vg.Generation &&
				meta.IsStatusConditionTrue(st.Conditions, computev1alpha1.ConditionReconciling) &&
				meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionStalled) == nil,
			fmt.Sprintf("%s %+v: %s", st.Phase, ready, st.LastMessage)
	})
}

// checkFolder checks that the folder holds exactly the VMs web-0 … web-<n-1> of a group called
// web, each once, and nothing else.
func (f *fixture) checkFolder(t *testing.T, folder string, n int) {
	t.Helper()
	want := make([]string, n)
	for i := range n {
		want[i] = fmt.Sprintf("web-%d", i)
	}
	slices.Sort(want) // as Contents sorts
	if got := f.sim.Contents(t, folder); !slices.Equal(got, want) {
		t.Errorf("folder holds %v, want exactly %v", got, want)
	}
}

// checkClones checks that exactly n clones reached vCenter since before: none was made twice.
func (f *fixture) checkClones(t *testing.T, before, n int) {
	t.Helper()
	if c := f.calls.Calls()["CloneVM_Task"] - before; c != n {
		t.Errorf("%d clones reached vCenter for %d VMs", c, n)
	}
}

// warnings lists the reasons of the Warning Events about a group.
func (f *fixture) warnings(t *testing.T, vg *computev1alpha1.VmGroup) []string {
	t.Helper()
	var out []string
	for _, e := range f.events(t, vg) {
		if e.Type == "Warning" {
			out = append(out, e.Reason)
		}
	}
	return out
}
