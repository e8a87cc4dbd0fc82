package vmgroups

import (
	"context"
	"strings"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
)

// testPlacementInvalid puts a VM where the group's folder goes: a person has to fix that, so the
// group shows an Error, stalls, and is retried slowly instead of with the fast backoff; once the
// VM is gone the group is made.
func testPlacementInvalid(t *testing.T, f *fixture) {
	f.namespace(t, "t-inv")
	f.sim.AddVM(t, "/DC0/vm", "t-inv-x")
	vg := f.group(t, "t-inv", "x", 1, 1, 1, "tmpl-a")
	testenv.Eventually(t, "the Error phase", func() (bool, string) {
		vg = f.get(t, "t-inv", "x")
		ready := meta.FindStatusCondition(vg.Status.Conditions, computev1alpha1.ConditionReady)
		return vg.Status.Phase == computev1alpha1.PhaseError && ready != nil && ready.Reason == "PlacementInvalid" &&
				meta.IsStatusConditionTrue(vg.Status.Conditions, computev1alpha1.ConditionStalled) &&
				meta.FindStatusCondition(vg.Status.Conditions, computev1alpha1.ConditionReconciling) == nil,
			vg.Status.LastMessage
	})
	if want := `folder "/DC0/vm/t-inv-x": a VirtualMachine has this path, not a folder`; vg.Status.LastMessage != want {
		t.Errorf("message = %q, want %q", vg.Status.LastMessage, want)
	}
	if e := f.waitEvent(t, vg, "PlacementInvalid"); e.Type != "Warning" || !strings.Contains(e.Note, "not a folder") {
		t.Errorf("event = %s %q", e.Type, e.Note)
	}
	r := f.standalone(t, f.c, secretName, nil)
	res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)})
	if err != nil || res.RequeueAfter != r.SlowRetry {
		t.Errorf("Reconcile = %+v, %v; want a slow retry without error (no fast backoff)", res, err)
	}

	f.sim.Destroy(t, "/DC0/vm/t-inv-x")
	f.waitRunning(t, "t-inv", "x", 1)
}
