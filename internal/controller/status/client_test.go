package status

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// env is the package's API server: each test keeps to a namespace of its own.
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Package(m, &env, nil)) }

// TestClientNeverReadsOlderThanItsOwnWrite injects stale copies (a lagging reader over a real API
// server) under the client and checks each read against what was last written.
func TestClientNeverReadsOlderThanItsOwnWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	scheme := manager.Scheme(computev1alpha1.AddToScheme)
	api, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	lagging := testenv.Lagging(api)
	c := NewClient(lagging, &computev1alpha1.VmGroup{}, &corev1.ConfigMap{})

	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"},
		Spec:       computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "t"},
	}
	must(t, api.Create(ctx, vg))
	key := client.ObjectKeyFromObject(vg)

	t.Run("a status write is read back while the reader lags", func(t *testing.T) {
		before := vg.DeepCopy()
		vg.Status.Phase = computev1alpha1.PhaseRunning
		SetConditions(&vg.Status.Conditions, vg.Generation, Healthy("Running", "1/1 VMs running", 0))
		must(t, c.Status().Patch(ctx, vg, client.MergeFrom(before)))

		stale := &computev1alpha1.VmGroup{}
		must(t, lagging.Get(ctx, key, stale))
		if stale.Status.Phase != "" {
			t.Fatalf("the lagging reader shows the write already (phase %q): the test proves nothing", stale.Status.Phase)
		}
		got := &computev1alpha1.VmGroup{}
		must(t, c.Get(ctx, key, got))
		if got.Status.Phase != computev1alpha1.PhaseRunning || ReadyReason(got.Status.Conditions) != "Running" {
			t.Errorf("read phase %q, Ready %q; want the written Running", got.Status.Phase, ReadyReason(got.Status.Conditions))
		}
		if got.ResourceVersion != vg.ResourceVersion || got.ManagedFields != nil {
			t.Errorf("read resourceVersion %s (managedFields %d), want the write's %s without managedFields",
				got.ResourceVersion, len(got.ManagedFields), vg.ResourceVersion)
		}

		list := &computev1alpha1.VmGroupList{}
		must(t, c.List(ctx, list, client.InNamespace(ns)))
		if len(list.Items) != 1 || list.Items[0].Status.Phase != computev1alpha1.PhaseRunning {
			t.Errorf("List shows %+v, want the written status", list.Items)
		}
	})

	t.Run("a newer write by someone else wins once the reader sees it", func(t *testing.T) {
		theirs := &computev1alpha1.VmGroup{}
		must(t, api.Get(ctx, key, theirs))
		before := theirs.DeepCopy()
		theirs.Status.Phase = computev1alpha1.PhaseError
		must(t, api.Status().Patch(ctx, theirs, client.MergeFrom(before)))
		lagging.CatchUp()

		got := &computev1alpha1.VmGroup{}
		must(t, c.Get(ctx, key, got))
		if got.Status.Phase != computev1alpha1.PhaseError {
			t.Errorf("read phase %q, want the newer Error", got.Status.Phase)
		}
	})

	t.Run("metadata patches of a guarded kind are guarded", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "request"}}
		must(t, api.Create(ctx, cm))
		before := cm.DeepCopy()
		cm.Annotations = map[string]string{"state": "Ready"}
		must(t, c.Patch(ctx, cm, client.MergeFrom(before)))
		got := &corev1.ConfigMap{}
		must(t, c.Get(ctx, client.ObjectKeyFromObject(cm), got))
		if got.Annotations["state"] != "Ready" {
			t.Errorf("annotations %v, want state=Ready", got.Annotations)
		}
	})

	t.Run("other kinds read as the reader has them", func(t *testing.T) {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sa"}}
		must(t, api.Create(ctx, sa))
		before := sa.DeepCopy()
		sa.Labels = map[string]string{"x": "y"}
		must(t, c.Patch(ctx, sa, client.MergeFrom(before)))
		got := &corev1.ServiceAccount{}
		must(t, c.Get(ctx, client.ObjectKeyFromObject(sa), got))
		if got.Labels["x"] != "" {
			t.Errorf("an unguarded kind was freshened: labels %v", got.Labels)
		}
	})

	t.Run("a re-created object is not mistaken for the one written", func(t *testing.T) {
		lagging.CatchUp()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again"}}
		must(t, api.Create(ctx, cm))
		before := cm.DeepCopy()
		cm.Annotations = map[string]string{"state": "Ready"}
		must(t, c.Patch(ctx, cm, client.MergeFrom(before)))
		must(t, api.Delete(ctx, cm))
		lagging.CatchUp()
		must(t, api.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "again"}}))
		got := &corev1.ConfigMap{}
		must(t, c.Get(ctx, client.ObjectKeyFromObject(cm), got))
		if got.Annotations["state"] != "" || got.UID == cm.UID {
			t.Errorf("read the deleted object's write (uid %s, annotations %v)", got.UID, got.Annotations)
		}
	})

	t.Run("copies nobody reads again are dropped by later writes", func(t *testing.T) {
		lagging.CatchUp()
		write := func(name string) client.Object {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			must(t, api.Create(ctx, cm))
			before := cm.DeepCopy()
			cm.Annotations = map[string]string{"state": "Ready"}
			must(t, c.Patch(ctx, cm, client.MergeFrom(before)))
			return cm
		}
		var served []client.Object
		for i := range 10 {
			served = append(served, write(fmt.Sprintf("served-%d", i)))
		}
		lagging.CatchUp() // the cache has them now; nothing reads them again
		for i := range 10 {
			write(fmt.Sprintf("later-%d", i))
		}
		f := c.(*fresh)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, obj := range served {
			if _, kept := f.last[keyOf(obj)]; kept {
				t.Errorf("the copy of %s is kept after the reader caught up and 10 more writes", obj.GetName())
			}
		}
		if len(f.last) > 10 {
			t.Errorf("%d copies kept, want at most the 10 writes the reader has not seen", len(f.last))
		}
	})

	t.Run("copies the reader has caught up with are dropped", func(t *testing.T) {
		lagging.CatchUp()
		for _, obj := range []client.Object{&computev1alpha1.VmGroup{}, &corev1.ConfigMap{}} {
			_ = c.List(ctx, listFor(obj), client.InNamespace(ns))
		}
		f := c.(*fresh)
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.last) != 0 {
			t.Errorf("%d copies kept after the reader caught up", len(f.last))
		}
	})
}

func listFor(obj client.Object) client.ObjectList {
	if _, ok := obj.(*corev1.ConfigMap); ok {
		return &corev1.ConfigMapList{}
	}
	return &computev1alpha1.VmGroupList{}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
