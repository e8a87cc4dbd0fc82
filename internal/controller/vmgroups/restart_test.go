package vmgroups

import (
	"fmt"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"

	"k8s.io/utils/ptr"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
)

// testRestartMidScale stops the manager while vCenter carries out a batch whose answers never
// reach it, as when the operator's pod is killed mid-call, and starts a new manager on the same API
// server and vCenter: the new one must adopt what the old one made, make no duplicate and leave
// no orphan.
func testRestartMidScale(t *testing.T, f *fixture) {
	const ns, name, folder = "t-restart", "web", "/DC0/vm/t-restart-web"
	f.namespace(t, ns)
	// Scale up 0 → 12 in batches of 4: the first batch is answered, the second carried out with
	// its answers held until the manager stops.
	clones := f.calls.Calls()["CloneVM_Task"]
	f.faults.Set(&vsimtest.Rule{Kinds: []vsimtest.Kind{vsimtest.Hold}, Methods: []string{"CloneVM_Task"}, After: 4, Fraction: 1})
	f.group(t, ns, name, 12, 1, 1, "tmpl-a")
	testenv.Eventually(t, "the second batch carried out, unanswered", func() (bool, string) {
		return f.faults.Injected() == 4, fmt.Sprintf("%d held", f.faults.Injected())
	})
	t.Logf("manager stopped with %d VMs in the folder, 4 of them unknown to it", len(f.sim.Contents(t, folder)))
	f.faults.Set(nil)
	f.restart(t)
	vg := f.waitRunning(t, ns, name, 12)
	f.checkFolder(t, folder, 12)
	f.checkClones(t, clones, 12)
	if len(vg.Status.VMs) != 12 || len(vg.Status.UnmanagedVMs) != 0 {
		t.Errorf("status lists %d VMs and unmanaged %v", len(vg.Status.VMs), vg.Status.UnmanagedVMs)
	}

	// Scale down 12 → 2: the ten removals run at once; four destroys are answered, the other six
	// carried out unanswered, and the manager stops.
	f.faults.Set(&vsimtest.Rule{Kinds: []vsimtest.Kind{vsimtest.Hold}, Methods: []string{"Destroy_Task"}, After: 4, Fraction: 1})
	f.update(t, ns, name, func(s *computev1alpha1.VmGroupSpec) { s.Replicas = ptr.To[int32](2) })
	testenv.Eventually(t, "six destroys carried out, unanswered", func() (bool, string) {
		return f.faults.Injected() == 6, fmt.Sprintf("%d held", f.faults.Injected())
	})
	t.Logf("manager stopped with %d VMs in the folder", len(f.sim.Contents(t, folder)))
	f.faults.Set(nil)
	f.restart(t)
	vg = f.waitRunning(t, ns, name, 2)
	f.checkFolder(t, folder, 2)
	if len(vg.Status.VMs) != 2 || len(vg.Status.UnmanagedVMs) != 0 {
		t.Errorf("status lists %d VMs and unmanaged %v", len(vg.Status.VMs), vg.Status.UnmanagedVMs)
	}
}
