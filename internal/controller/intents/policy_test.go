package intents

import (
	"context"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testEvents: a new binding records one Event, NimbusPolicyCreated on the binding; its
// NimbusPolicy's first generation records none (its status lists what was made), nor does the
// binding's becoming Ready once the NimbusPolicy is. What
// happens to the policy later (a revert) records PoliciesChanged on it, and a reconcile that
// changes nothing records nothing. The reconcilers are called in turn, each Event read as it is
// recorded.
func testEvents(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.stop(t)
	defer f.run(t)
	const ns = "t-events"
	f.namespace(t, ns)
	f.intent(t, "events-dns", "dnsManipulation", nil)
	sib := f.binding(t, ns, "events", map[string]string{"app": "events"}, "events-dns")

	// The controllers set up as in the operator, not started: their caches, started alone, hold
	// what the reconcilers read.
	mgr, built := f.newManager(t)
	testenv.StartCache(t, mgr.GetCache())
	testenv.StartCache(t, built.objects)
	testenv.StartCache(t, built.nodes)
	rec := events.NewFakeRecorder(100)
	b := *built
	b.recorder = rec
	bindings, policies := &bindingReconciler{base: &b}, &policyReconciler{base: &b}
	cached := func(obj client.Object, c interface {
		Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error
	}) func() (bool, string) {
		return func() (bool, string) {
			err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
			return err == nil, testenv.ErrString(err)
		}
	}
	eventually(t, "the binding in the cache", cached(sib, mgr.GetCache()))
	expect := func(what string, r reconcileFunc, key client.Object, want ...string) {
		t.Helper()
		if _, err := r(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(key)}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := testenv.EventReasons(rec); !slices.Equal(got, want) {
			t.Errorf("%s: Events %v, want %v", what, got, want)
		}
	}

	expect("the binding's reconcile", bindings.Reconcile, sib, "NimbusPolicyCreated")
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sib.Name}}
	eventually(t, "the NimbusPolicy in the cache", cached(np, mgr.GetCache()))
	expect("the NimbusPolicy's first generation", policies.Reconcile, np)
	f.get(t, np)
	if r := status.ReadyReason(np.Status.Conditions); r != "Generated" || len(np.Status.Policies) != 2 {
		t.Fatalf("NimbusPolicy Ready %s with %v, want Generated with its 2 policies", r, np.Status.Policies)
	}
	// The binding wrote no status before its NimbusPolicy reported: that report wakes it, and
	// one status write says what it then knows.
	f.get(t, sib)
	if len(sib.Status.Conditions) != 0 || sib.Status.NimbusPolicy != "" {
		t.Fatalf("binding status %+v before its NimbusPolicy reported, want none yet", sib.Status)
	}
	// The NimbusPolicy's Ready wakes the binding (a watch), which is then in force: no Event, the
	// expected next step of a new binding.
	eventually(t, "the NimbusPolicy's status in the cache", func() (bool, string) {
		cur := &intentv1alpha1.NimbusPolicy{}
		err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(np), cur)
		return err == nil && status.ReadyReason(cur.Status.Conditions) == "Generated", testenv.ErrString(err)
	})
	expect("the binding's reconcile once its NimbusPolicy is Ready", bindings.Reconcile, sib)
	f.get(t, sib)
	if r := status.ReadyReason(sib.Status.Conditions); r != "Bound" {
		t.Fatalf("binding Ready %s, want Bound", r)
	}

	netpol := &unstructured.Unstructured{}
	netpol.SetGroupVersionKind(intent.NetworkPolicyKind)
	netpol.SetNamespace(ns)
	netpol.SetName(sib.Name + "-dnsmanipulation")
	must(t, f.c.Delete(ctx, netpol))
	eventually(t, "the deletion in the cache", func() (bool, string) {
		err := built.objects.Get(ctx, client.ObjectKeyFromObject(netpol), netpol.DeepCopy())
		return apierrors.IsNotFound(err), testenv.ErrString(err)
	})
	expect("a deleted policy made again", policies.Reconcile, np, "PoliciesChanged")
	eventually(t, "the policy made again in the cache", cached(netpol, built.objects))
	expect("a reconcile of what is right", policies.Reconcile, np)
	expect("a reconcile of a bound binding", bindings.Reconcile, sib)
}

// testEngineCacheBehind: a NimbusPolicy's reconcile whose engine-policy cache does not show the
// policies its status lists (the cache behind the reconcile that made them, as under load) asks
// the API server, finds them as generated, and writes nothing, rather than creating them again
// for a refusal. The cache here is a real one that shows nothing: it watches a label no policy
// carries.
func testEngineCacheBehind(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.stop(t)
	defer f.run(t)
	const ns = "t-behind"
	f.namespace(t, ns)
	f.intent(t, "behind-dns", "dnsManipulation", nil)
	sib := f.binding(t, ns, "behind", map[string]string{"app": "behind"}, "behind-dns")
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sib.Name}}

	mgr, built := f.newManager(t)
	testenv.StartCache(t, mgr.GetCache())
	testenv.StartCache(t, built.objects)
	testenv.StartCache(t, built.nodes)
	b := *built
	b.recorder = events.NewFakeRecorder(100)
	eventually(t, "the binding in the cache", func() (bool, string) {
		err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(sib), &intentv1alpha1.SecurityIntentBinding{})
		return err == nil, testenv.ErrString(err)
	})
	_, err := (&bindingReconciler{base: &b}).Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(sib)})
	must(t, err)
	eventually(t, "the NimbusPolicy in the cache", func() (bool, string) {
		err := mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(np), &intentv1alpha1.NimbusPolicy{})
		return err == nil, testenv.ErrString(err)
	})
	_, err = (&policyReconciler{base: &b}).Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(np)})
	must(t, err)
	f.get(t, np)
	if r := status.ReadyReason(np.Status.Conditions); r != "Generated" || len(np.Status.Policies) != 2 {
		t.Fatalf("NimbusPolicy Ready %s with %v, want Generated with its 2 policies", r, np.Status.Policies)
	}

	behind, err := cache.New(f.env.Config, cache.Options{Scheme: f.scheme, Mapper: mgr.GetRESTMapper(),
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{"quartermaster.dev/test": "shows-nothing"})})
	must(t, err)
	for _, gvk := range namespacedKinds {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gvk)
		must(t, behind.IndexField(ctx, obj, cluster.IndexController, cluster.ControllerUID))
	}
	testenv.StartCache(t, behind)
	cfg, api := testenv.Counting(f.env.Config)
	counted, err := client.New(cfg, client.Options{Scheme: f.scheme, Cache: &client.CacheOptions{Reader: mgr.GetCache()}})
	must(t, err)
	apiReader, err := client.New(cfg, client.Options{Scheme: f.scheme})
	must(t, err)
	rec := events.NewFakeRecorder(100)
	b.objects, b.apiReader, b.recorder = behind, apiReader, rec
	b.client = status.NewClient(counted, &intentv1alpha1.NimbusPolicy{})
	_, err = (&policyReconciler{base: &b}).Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(np)})
	must(t, err)
	if n := api.Writes(); n != 0 {
		t.Errorf("a reconcile on a cache behind its policies wrote %d times: %v", n, api.Log())
	}
	if got := testenv.EventReasons(rec); len(got) > 0 {
		t.Errorf("a reconcile on a cache behind its policies recorded Events %v", got)
	}
}
