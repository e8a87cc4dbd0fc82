package vmgroups

import (
	"context"
	"slices"
	"testing"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testStaleCache brings a group to Running while reads lag behind the controller's own writes (as
// the informer cache does for a few milliseconds), then reconciles once more: that reconcile must
// not announce Running again, look for the folder again or write anything.
func testStaleCache(t *testing.T, f *fixture) {
	ctx := context.Background()
	// The reconciler is called directly: no manager may reconcile the group meanwhile.
	f.stop(t)
	defer f.restart(t)
	f.namespace(t, "t-stale")
	vg := f.group(t, "t-stale", "lag", 2, 1, 1, "tmpl-a")

	cfg, api := testenv.Counting(f.env.Config)
	counted, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	lagging := testenv.Lagging(counted)
	vsCalls := &vsimtest.Counter{}
	r := f.standalone(t, status.NewClient(lagging, &computev1alpha1.VmGroup{}), secretName, vsCalls.Wrap)
	rec := events.NewFakeRecorder(100)
	r.Recorder = rec
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vg)}

	var reasons []string
	for i := 0; i < 20 && !slices.Contains(reasons, "Running"); i++ {
		_, err := r.Reconcile(ctx, req)
		must(t, err)
		reasons = append(reasons, testenv.EventReasons(rec)...)
		awaitWork(t, r, req.NamespacedName)
	}
	if !slices.Contains(reasons, "Running") {
		t.Fatalf("not Running after 10 reconciles; Events %v", reasons)
	}
	if lagging.Lags() == 0 {
		t.Fatal("the reads do not lag: the test proves nothing")
	}
	stale := &computev1alpha1.VmGroup{}
	must(t, lagging.Get(ctx, req.NamespacedName, stale))
	if stale.Status.Folder != "" {
		t.Fatalf("the lagging reader shows the status (folder %q): the test proves nothing", stale.Status.Folder)
	}

	api.Reset()
	vsCalls.Reset()
	_, err = r.Reconcile(ctx, req)
	must(t, err)
	if got := testenv.EventReasons(rec); len(got) > 0 {
		t.Errorf("a reconcile on the stale copy recorded Events %v, want none", got)
	}
	if n := vsCalls.Total(); n > 2 {
		t.Errorf("a reconcile on the stale copy made %d vSphere calls, want the drift check's 2 at most: %v", n, vsCalls.Calls())
	}
	if n := api.Writes(); n != 0 {
		t.Errorf("a reconcile on the stale copy wrote %d times: %v", n, api.Log())
	}
}
