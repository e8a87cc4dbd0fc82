package mirrors

import (
	"context"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testStaleCache brings a mirror to Ready while reads lag behind the controller's own writes (as
// the informer caches do for a few milliseconds), then reconciles once more on a copy of the
// mirror older than the Ready status just written: that reconcile must not announce Ready again,
// patch the status again or write anything else.
func testStaleCache(t *testing.T, f *fixture) {
	ctx := context.Background()
	// The reconciler is called directly: no manager may reconcile the mirror meanwhile.
	f.stop(t)
	defer f.run(t)

	// A manager set up as in the operator but not started: its cache, started alone, holds the
	// mirrors with the field indexes the reconciler lists them by (one mirror per host).
	mgr, built, _ := f.newManager(t)
	testenv.StartCache(t, mgr.GetCache())
	testenv.StartCache(t, built.usage) // the images pinning reads
	// Mirrors are read from that cache, their objects from the API server; both lag behind the
	// reconciler's own writes. Every request is counted.
	cfg, api := testenv.Counting(env.Config)
	objectKinds := []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}, &corev1.Service{}, &appsv1.StatefulSet{}, &appsv1.DaemonSet{}, &policyv1.PodDisruptionBudget{}}
	counted, err := client.New(cfg, client.Options{Scheme: f.scheme, Cache: &client.CacheOptions{Reader: mgr.GetCache(), DisableFor: objectKinds}})
	must(t, err)
	apiReader, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	lagging := testenv.Lagging(counted)
	rec := events.NewFakeRecorder(100)
	r := *built
	r.client = status.NewClient(lagging, &registryv1alpha1.RegistryMirror{})
	r.objects = status.NewClient(lagging, objectKinds...)
	r.apiReader, r.recorder = apiReader, rec

	rm := mirrorOf("lagged", f.open, "lagged.example")
	f.create(t, rm)
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(rm)}
	testenv.Eventually(t, "the mirror in the cache", func() (bool, string) {
		err := mgr.GetCache().Get(ctx, req.NamespacedName, &registryv1alpha1.RegistryMirror{})
		return err == nil, testenv.ErrString(err)
	})

	// Bring it to Ready, with the reads current at the start of each reconcile (the caches have
	// seen the previous reconcile's writes) and lagging within it.
	var reasons []string
	for i := 0; !slices.Contains(reasons, ReasonReady); i++ {
		if i == 10 {
			t.Fatalf("not Ready after 10 reconciles; Events %v", reasons)
		}
		lagging.CatchUp()
		_, err := r.Reconcile(ctx, req)
		must(t, err)
		reasons = append(reasons, testenv.EventReasons(rec)...)
		if i == 0 {
			f.becomeReady(t, "lagged", 2) // the StatefulSet and DaemonSet controllers' part
		}
	}
	if lagging.Lags() == 0 {
		t.Fatal("the reads do not lag: the test proves nothing")
	}
	stale := &registryv1alpha1.RegistryMirror{}
	must(t, lagging.Get(ctx, req.NamespacedName, stale))
	if reason := status.ReadyReason(stale.Status.Conditions); reason == ReasonReady {
		t.Fatalf("the lagging reader shows the mirror %s already: the test proves nothing", reason)
	}

	api.Reset()
	_, err = r.Reconcile(ctx, req)
	must(t, err)
	if got := testenv.EventReasons(rec); len(got) > 0 {
		t.Errorf("a reconcile on the stale copy recorded Events %v, want none", got)
	}
	if n := api.Writes(); n != 0 {
		t.Errorf("a reconcile on the stale copy wrote %d times: %v", n, api.Log())
	}
	got := &registryv1alpha1.RegistryMirror{}
	must(t, f.c.Get(ctx, req.NamespacedName, got))
	if reason := status.ReadyReason(got.Status.Conditions); reason != ReasonReady {
		t.Errorf("the mirror is %s after the reconcile on the stale copy, want %s", reason, ReasonReady)
	}
}
