package intents

import (
	"context"
	"fmt"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testStaleCache brings a SecurityIntent, a binding and a cluster binding to Ready while reads lag
// behind the controller's own writes (as the informer cache does for a few milliseconds), then
// reconciles each once more on copies older than the reconcile that made it Ready: none may
// announce again, write its status again or write anything else (the NimbusPolicies that
// reconcile made included).
func testStaleCache(t *testing.T, f *fixture) {
	ctx := context.Background()
	// The reconcilers are called directly: no manager may reconcile these objects meanwhile.
	f.stop(t)
	defer f.run(t)
	const ns = "t-stale"
	f.namespace(t, ns)
	si := f.intent(t, "stale-dns", "dnsManipulation", nil)
	sib := f.binding(t, ns, "lagged", map[string]string{"app": "lagged"}, "stale-dns")
	csib := &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "lagged"},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{Intents: []intentv1alpha1.MatchIntent{{Name: "stale-dns"}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{NsSelector: intentv1alpha1.NamespaceSelector{MatchNames: []string{ns}}}},
	}
	must(t, f.c.Create(ctx, csib))

	// The controllers set up as in the operator but not started: their caches, started alone,
	// hold what the reconcilers read, with the field indexes they list by. Reads lag behind the
	// reconcilers' own writes; every request is counted.
	mgr, built := f.newManager(t)
	testenv.StartCache(t, mgr.GetCache())
	testenv.StartCache(t, built.namespaces)
	testenv.StartCache(t, built.objects)
	testenv.StartCache(t, built.nodes)
	cfg, api := testenv.Counting(f.env.Config)
	counted, err := client.New(cfg, client.Options{Scheme: f.scheme, Cache: &client.CacheOptions{Reader: mgr.GetCache()}})
	must(t, err)
	apiReader, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	lagging := testenv.Lagging(counted)
	rec := events.NewFakeRecorder(100)
	b := *built
	b.client = status.NewClient(lagging,
		&intentv1alpha1.SecurityIntent{}, &intentv1alpha1.SecurityIntentBinding{}, &intentv1alpha1.ClusterSecurityIntentBinding{},
		&intentv1alpha1.NimbusPolicy{}, &intentv1alpha1.ClusterNimbusPolicy{})
	b.apiReader, b.recorder = apiReader, rec
	eventually(t, "the objects in the caches", func() (bool, string) {
		for _, obj := range []client.Object{si, sib, csib} {
			if err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); err != nil {
				return false, err.Error()
			}
		}
		list := namespaceMetadataList()
		if err := built.namespaces.List(ctx, list); err != nil {
			return false, err.Error()
		}
		return slices.ContainsFunc(list.Items, func(m metav1.PartialObjectMetadata) bool { return m.Name == ns }), "namespace " + ns + " not cached"
	})
	bindings, clusterBindings := &bindingReconciler{base: &b}, &clusterBindingReconciler{base: &b}
	policies, clusterPolicies := &policyReconciler{base: &b}, &clusterPolicyReconciler{base: &b}
	// What a binding made reports Ready (its watch would wake the binding): reconciled after
	// each of the binding's reconciles.
	generated := func(reqs ...reconcile.Request) func() {
		return func() {
			for _, req := range reqs {
				r := policies.Reconcile
				if req.Namespace == "" {
					r = clusterPolicies.Reconcile
				}
				_, err := r(ctx, req)
				must(t, err)
			}
		}
	}
	npReq := func(ns, name string) reconcile.Request {
		return reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}
	}

	for _, tc := range []struct {
		name      string
		obj       client.Object
		reconcile reconcileFunc
		after     func() // what the reconcile made reports
		ready     string // the Ready reason once ready
	}{
		{"SecurityIntentBinding", sib, bindings.Reconcile, generated(npReq(ns, "lagged")), "Bound"},
		{"ClusterSecurityIntentBinding", csib, clusterBindings.Reconcile,
			generated(npReq("", "lagged"), npReq(ns, intent.ClusterPolicyNamePrefix+"lagged")), "Bound"},
		{"SecurityIntent", si, (&intentReconciler{base: &b}).Reconcile, func() {}, "Accepted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tc.obj)}
			// Bring it to Ready, with the reads current at the start of each reconcile (the cache
			// has seen the previous reconcile's writes) and lagging within it.
			var reasons []string
			for i := 0; readyReason(tc.obj) != tc.ready; i++ {
				if i == 10 {
					t.Fatalf("not %s after 10 reconciles (%s); Events %v", tc.ready, readyReason(tc.obj), reasons)
				}
				lagging.CatchUp()
				_, err := tc.reconcile(ctx, req)
				must(t, err)
				reasons = append(reasons, testenv.EventReasons(rec)...)
				tc.after()
				_ = testenv.EventReasons(rec) // what the NimbusPolicies recorded is theirs
				f.get(t, tc.obj)
			}
			if lagging.Lags() == 0 {
				t.Fatal("the reads do not lag: the test proves nothing")
			}
			stale := tc.obj.DeepCopyObject().(client.Object)
			must(t, lagging.Get(ctx, req.NamespacedName, stale))
			if reason := readyReason(stale); reason == tc.ready || stale.GetResourceVersion() == tc.obj.GetResourceVersion() {
				t.Fatalf("the lagging reader shows the %s as written (%s): the test proves nothing", tc.name, reason)
			}

			api.Reset()
			_, err := tc.reconcile(ctx, req)
			must(t, err)
			if got := testenv.EventReasons(rec); len(got) > 0 {
				t.Errorf("a reconcile on the stale copy recorded Events %v, want none", got)
			}
			if n := api.Writes(); n != 0 {
				t.Errorf("a reconcile on the stale copy wrote %d times: %v", n, api.Log())
			}
		})
	}

	// The status saying a NimbusPolicy was made does not keep one deleted since from being made
	// again.
	t.Run("a deleted NimbusPolicy is made again", func(t *testing.T) {
		for _, tc := range []struct {
			np        *intentv1alpha1.NimbusPolicy
			owner     client.Object
			reconcile reconcileFunc
		}{
			{&intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sib.Name}}, sib, bindings.Reconcile},
			{&intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: intent.ClusterPolicyNamePrefix + csib.Name}}, csib, clusterBindings.Reconcile},
		} {
			key := client.ObjectKeyFromObject(tc.np)
			must(t, f.c.Delete(ctx, tc.np))
			eventually(t, fmt.Sprintf("NimbusPolicy %s gone from the cache", key), func() (bool, string) {
				err := mgr.GetCache().Get(ctx, key, &intentv1alpha1.NimbusPolicy{})
				return apierrors.IsNotFound(err), testenv.ErrString(err)
			})
			lagging.CatchUp()
			_, err := tc.reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(tc.owner)})
			must(t, err)
			np := &intentv1alpha1.NimbusPolicy{}
			must(t, f.c.Get(ctx, key, np))
			if !metav1.IsControlledBy(np, tc.owner) {
				t.Errorf("NimbusPolicy %s made again is controlled by %v", key, np.OwnerReferences)
			}
			testenv.EventReasons(rec)
		}
	})
}

type reconcileFunc = func(context.Context, reconcile.Request) (reconcile.Result, error)

// readyReason is the Ready reason of a SecurityIntent or a binding.
func readyReason(obj client.Object) string {
	switch o := obj.(type) {
	case *intentv1alpha1.SecurityIntent:
		return status.ReadyReason(o.Status.Conditions)
	case *intentv1alpha1.SecurityIntentBinding:
		return status.ReadyReason(o.Status.Conditions)
	case *intentv1alpha1.ClusterSecurityIntentBinding:
		return status.ReadyReason(o.Status.Conditions)
	}
	panic(fmt.Sprintf("readyReason of a %T", obj))
}
