package vmgroups

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
)

// testSecretWatched runs a manager whose resync and slow retry are far away, so only the watch of
// the vCenter Secret can explain a prompt reconcile: a resync reads no Secret from the API server,
// and a rotated Secret reaches every group at once, broken and then fixed.
func testSecretWatched(t *testing.T, f *fixture) {
	ctx := context.Background()
	groups := &computev1alpha1.VmGroupList{}
	must(t, f.c.List(ctx, groups))
	if len(groups.Items) == 0 {
		t.Fatal("no VmGroups to watch")
	}
	f.stop(t)
	f.calls.Reset()
	f.setup(t, func(r *Reconciler) { r.Resync, r.SlowRetry = time.Hour, time.Hour })
	f.run()
	defer f.restart(t) // later steps expect the usual periods
	// The new manager reconciles every group once as it starts (one folder lookup each); the
	// Secret changes only after that.
	testenv.Eventually(t, "every group reconciled", func() (bool, string) {
		n := f.calls.Calls()["FindByInventoryPath"]
		return n >= len(groups.Items), fmt.Sprintf("%d of %d", n, len(groups.Items))
	})
	for _, vg := range groups.Items {
		f.waitRunning(t, vg.Namespace, vg.Name, *vg.Spec.Replicas)
	}

	vg := &groups.Items[0]
	f.api.Reset()
	res, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)})
	must(t, err)
	if res.RequeueAfter < time.Hour {
		t.Errorf("RequeueAfter = %s, want the resync", res.RequeueAfter)
	}
	for _, req := range f.api.Log() {
		if strings.Contains(req, "/secrets") {
			t.Errorf("a reconcile that changes nothing read a Secret from the API server: %s", req)
		}
	}

	rotate := func(pass string) {
		t.Helper()
		s := &corev1.Secret{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: operatorNS, Name: secretName}, s))
		s.Data[keyPass] = []byte(pass)
		must(t, f.c.Update(ctx, s))
	}
	rotate("not-the-password")
	for _, vg := range groups.Items {
		testenv.Eventually(t, vg.Name+" in "+vg.Namespace+" refused", func() (bool, string) {
			st := f.get(t, vg.Namespace, vg.Name).Status
			ready := meta.FindStatusCondition(st.Conditions, computev1alpha1.ConditionReady)
			return ready != nil && ready.Reason == "LoginFailed", st.LastMessage
		})
	}
	rotate(f.sim.Password)
	for _, vg := range groups.Items {
		f.waitRunning(t, vg.Namespace, vg.Name, *vg.Spec.Replicas)
	}
}
