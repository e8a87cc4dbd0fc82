package controllers_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestKindsAsksOncePerGroupVersionAndStopsWhenMet: two needs of one group version cost one
// question per look, and none once both are met.
func TestKindsAsksOncePerGroupVersionAndStopsWhenMet(t *testing.T) {
	t.Parallel()
	gv := schema.GroupVersion{Group: "example.quartermaster.dev", Version: "v1"}
	d := &countingDiscovery{}
	logs := &lines{}
	kinds := controllers.NewKindsWith(d, time.Hour, funcr.New(logs.add, funcr.Options{}))
	ctx := context.Background()
	a := controllers.Need{Name: "a", Kinds: []schema.GroupVersionKind{gv.WithKind("A")}}
	b := controllers.Need{Name: "b", Kinds: []schema.GroupVersionKind{gv.WithKind("B")}, Announce: "b is here"}
	if kinds.Check(ctx, a) || kinds.Check(ctx, b) {
		t.Fatal("met before anything is served")
	}
	if got, failed := kinds.Missing(a); got != "A.example.quartermaster.dev/v1" || failed {
		t.Errorf("Missing(a) = %q, %v", got, failed)
	}
	asked := d.polls()
	d.serve(&metav1.APIResourceList{GroupVersion: gv.String(), APIResources: []metav1.APIResource{{Name: "as", Kind: "A"}, {Name: "bs", Kind: "B"}}})
	done := make(chan struct{})
	go func() { <-kinds.Met(a); <-kinds.Met(b); close(done) }()
	// One look (Start's first), then ctx ends: Start returns.
	lookCtx, cancel := context.WithCancel(ctx)
	go func() { <-done; cancel() }()
	if err := kinds.Start(lookCtx); err != nil {
		t.Fatal(err)
	}
	if n := d.polls() - asked; n != 1 {
		t.Errorf("one look at two needs of one group version asked %d times, want once", n)
	}
	if !kinds.Has(a) || !kinds.Has(b) || func() bool { m, _ := kinds.Missing(a); return m != "" }() {
		t.Error("not met after the look that found them")
	}
	if n := logs.count("b is here"); n != 1 {
		t.Errorf("the announcement was logged %d times, want once", n)
	}
	asked = d.polls()
	if !kinds.Check(ctx, a) || d.polls() != asked {
		t.Error("a need met is asked for again")
	}
}

// TestLateWatchStartsWhenTheKindIsServed: a controller built with a Late watch of a kind whose CRD
// does not exist yet starts and reconciles its own kind; once the CRD is installed, the watch
// delivers the new kind's events, Prepare ran before it started and Appeared once, after it.
// A Late watch whose kind is served at the start holds the controller's workers until it synced.
func TestLateWatchStartsWhenTheKindIsServed(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	scheme := manager.Scheme(apiextensionsv1.AddToScheme)
	mgr, err := ctrl.New(env.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	must(t, err)
	kinds, err := controllers.NewKinds(mgr, 50*time.Millisecond)
	must(t, err)
	group := fmt.Sprintf("late%d.quartermaster.dev", time.Now().UnixNano())
	gvk := schema.GroupVersionKind{Group: group, Version: "v1", Kind: "Gadget"}
	need := controllers.Need{Name: "gadgets", Kinds: []schema.GroupVersionKind{gvk}}
	cms := controllers.Need{Name: "configmaps", Kinds: []schema.GroupVersionKind{corev1.SchemeGroupVersion.WithKind("ConfigMap")}}
	if kinds.Check(ctx, need) || !kinds.Check(ctx, cms) {
		t.Fatal("Check: gadgets served before their CRD, or ConfigMaps not served")
	}

	var prepared, appeared, atStartSynced atomic.Int32
	var reconciledBeforeSync atomic.Bool
	gadget := &unstructured.Unstructured{}
	gadget.SetGroupVersionKind(gvk)
	late := kinds.Watch(need, mgr.GetCache(), gadget, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: "for-" + o.GetName()}}}
	})).Prepare(func(context.Context) error {
		prepared.Add(1)
		return nil
	}).Appeared(func(_ context.Context, q controllers.Queue) {
		if prepared.Load() != 1 {
			t.Errorf("Appeared ran with Prepare run %d times, want after it", prepared.Load())
		}
		appeared.Add(1)
		q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Namespace: "default", Name: "appeared"}})
	})
	cm := &corev1.ConfigMap{}
	atStart := kinds.Watch(cms, mgr.GetCache(), cm, handler.Funcs{}).Prepare(func(context.Context) error {
		atStartSynced.Add(1)
		return nil
	})
	reconciled := make(chan string, 100)
	must(t, builder.ControllerManagedBy(mgr).Named("late-test").
		For(&corev1.Namespace{}).
		WatchesRawSource(late).
		WatchesRawSource(atStart).
		Complete(reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
			if atStartSynced.Load() == 0 {
				reconciledBeforeSync.Store(true)
			}
			reconciled <- req.Name
			return reconcile.Result{}, nil
		})))
	running := testenv.Run(mgr)
	t.Cleanup(func() {
		if err := running.Stop(); err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	seen := map[string]bool{} // every reconcile, in whatever order they come
	await := func(name string) {
		t.Helper()
		testenv.PollFor(t, "a reconcile of "+name, time.Millisecond, time.Minute, func() (bool, string) {
			for {
				select {
				case got := <-reconciled:
					seen[got] = true
				default:
					return seen[name], fmt.Sprintf("reconciled %v", seen)
				}
			}
		})
	}
	await("default") // the controller runs without its late watch
	if reconciledBeforeSync.Load() {
		t.Error("a reconcile ran before the watch served at the start had synced")
	}
	if prepared.Load() != 0 {
		t.Error("Prepare ran before the kind was served")
	}

	must(t, env.Client.Create(ctx, gadgetCRD(group)))
	testenv.Eventually(t, "the CRD served", func() (bool, string) {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind("GadgetList"))
		err := env.Client.List(ctx, list)
		return err == nil, testenv.ErrString(err)
	})
	g := &unstructured.Unstructured{}
	g.SetGroupVersionKind(gvk)
	g.SetNamespace("default")
	g.SetName("one")
	must(t, env.Client.Create(ctx, g))
	await("appeared")
	await("for-one")
	if n := appeared.Load(); n != 1 {
		t.Errorf("Appeared ran %d times, want once", n)
	}
	if n := prepared.Load(); n != 1 {
		t.Errorf("Prepare ran %d times, want once", n)
	}
}

func gadgetCRD(group string) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "gadgets." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "gadgets", Singular: "gadget", Kind: "Gadget", ListKind: "GadgetList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true),
				}},
			}},
		},
	}
}
