package intents

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// engineRecheck is how often a policy waiting for an engine looks again, besides being woken when
// the engine is detected.
const engineRecheck = 5 * time.Minute

// engineWatchSync bounds the wait for a new engine's watches to deliver (a kind the manager may
// not list never does).
const engineWatchSync = time.Minute

// conflictRetry is how often a policy blocked by an object it does not control looks again.
const conflictRetry = 5 * time.Minute

// namespacedKinds are the engine kinds a NimbusPolicy generates; clusterKinds a ClusterNimbusPolicy's
// (assessTLS's CronJob and ConfigMap, in K8TLS's namespace, included).
var (
	namespacedKinds = []schema.GroupVersionKind{intent.KubeArmorPolicyKind, intent.NetworkPolicyKind, intent.KyvernoPolicyKind}
	clusterKinds    = []schema.GroupVersionKind{intent.KyvernoClusterPolicyKind, intent.CronJobKind, intent.ConfigMapKind}
)

// policyReconciler generates the engine policies of each NimbusPolicy.
type policyReconciler struct {
	*base
	engineWatch
}

func (r *policyReconciler) setup(mgr ctrl.Manager, opts controller.Options, engines []source.SyncingSource) (controller.Controller, error) {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range engines {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("nimbuspolicy").
		For(&intentv1alpha1.NimbusPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.all, &handler.EnqueueRequestForObject{})).
		WatchesRawSource(source.Channel(r.deferred.release, &handler.EnqueueRequestForObject{})).
		// A node's pod range is in the NetworkPolicies.
		WatchesRawSource(source.Kind[client.Object](r.nodes, &corev1.Node{},
			handler.EnqueueRequestsFromMapFunc(r.needing(needsNodes)), podCIDRChanged())).
		// A Deployment that appears, goes or changes labels is or is no longer a cocoWorkload target.
		WatchesRawSource(source.Kind[client.Object](r.deployments, deploymentMetadata(),
			handler.EnqueueRequestsFromMapFunc(r.needing(needsDeployments)), predicate.Or[client.Object](predicate.LabelChangedPredicate{}, createOrDelete()))).
		WithOptions(opts).
		Build(r)
}

// sources are the watches of engine e's kinds that this reconciler generates (each with the
// controller index in its cache).
func (w *engineWatch) sources(ctx context.Context, mgr ctrl.Manager, objects cache.Cache, engines ...intent.Engine) ([]source.SyncingSource, error) {
	var out []source.SyncingSource
	for _, e := range engines {
		for _, gvk := range intent.EngineKinds[e] {
			if !slices.Contains(w.kinds, gvk) {
				continue
			}
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(gvk)
			if err := w.index(ctx, objects, obj); err != nil {
				return nil, err
			}
			out = append(out, source.Kind[client.Object](objects, obj,
				handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), w.owner, handler.OnlyControllerOwner()), notCreated()))
		}
	}
	return out, nil
}

// engineWatch is how a policy reconciler follows the engines: it watches the kinds it generates
// (an edit or deletion of a generated policy reconciles its owner) and, when an engine appears,
// reconciles every owner, whose policies for the engine can be made now.
type engineWatch struct {
	kinds []schema.GroupVersionKind
	owner client.Object     // the (Cluster)NimbusPolicy kind that controls them
	list  client.ObjectList // a list of owners
	all   chan event.GenericEvent

	mu      sync.Mutex
	indexed map[schema.GroupVersionKind]bool // kinds whose cache has the controller index
}

func newEngineWatch(kinds []schema.GroupVersionKind, owner client.Object, list client.ObjectList) engineWatch {
	return engineWatch{kinds: kinds, owner: owner, list: list, all: make(chan event.GenericEvent, 64), indexed: map[schema.GroupVersionKind]bool{}}
}

// watchEngine adds c's watches on the engine's kinds among w's, from the cache objects, and with
// wake reconciles every owner. The kinds are indexed by their controller's UID in objects, so a
// reconcile lists its owner's policies only.
//
// The owner's own creations wake nothing: the reconcile that made them has just looked at them,
// and at start, or when an engine appears, every owner is reconciled anyway. An edit or deletion
// by hand reconciles the owner.
func (w *engineWatch) watchEngine(ctx context.Context, mgr ctrl.Manager, c controller.Controller, objects cache.Cache, reader client.Reader, e intent.Engine, wake bool) error {
	sources, err := w.sources(ctx, mgr, objects, e)
	if err != nil {
		return err
	}
	for _, src := range sources {
		if err := c.Watch(src); err != nil {
			return err
		}
	}
	if !wake {
		return nil // the controller has not started: it waits for its watches before reconciling
	}
	// A running controller's new watch starts on its own: until its handler is in place, an
	// engine's status write (Kyverno accepting a policy made meanwhile) would wake no one, and the
	// initial creations it then replays are filtered. So every owner is woken only once the
	// watches deliver: each then reads its policies as they are, and is told of what follows.
	syncCtx, cancel := context.WithTimeout(ctx, engineWatchSync)
	defer cancel()
	for _, src := range sources {
		if err := src.WaitForSync(syncCtx); err != nil {
			return err // the source is stopped; the engine is looked for, and watched, anew
		}
	}
	list := w.list.DeepCopyObject().(client.ObjectList)
	if err := reader.List(ctx, list); err != nil {
		return err
	}
	go func() {
		_ = forEach(list, func(o client.Object) { w.all <- event.GenericEvent{Object: o} })
	}()
	return nil
}

// index adds the controller index to obj's kind in objects, once (a watch that failed is added
// again later).
func (w *engineWatch) index(ctx context.Context, objects cache.Cache, obj client.Object) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	gvk := obj.GetObjectKind().GroupVersionKind()
	if w.indexed[gvk] {
		return nil
	}
	if err := objects.IndexField(ctx, obj, indexController, controllerUID); err != nil {
		return err
	}
	w.indexed[gvk] = true
	return nil
}

// notCreated passes updates and deletions of what a controller generates, not its creations: the
// reconcile that made an object has looked at it already, and the creations an informer replays
// when it starts are of owners reconciled at start anyway.
func notCreated() predicate.Predicate {
	return predicate.Funcs{CreateFunc: func(event.CreateEvent) bool { return false }}
}

// needing maps an object to the NimbusPolicies (of its namespace, or every one for a
// cluster-scoped object) whose rules need it.
func (r *policyReconciler) needing(needs func([]intentv1alpha1.NimbusRules) bool) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		list := &intentv1alpha1.NimbusPolicyList{}
		if err := r.client.List(ctx, list, client.InNamespace(obj.GetNamespace())); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		for _, np := range list.Items {
			if needs(np.Spec.NimbusRules) {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&np)})
			}
		}
		return reqs
	}
}

func createOrDelete() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
}

func podCIDRChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return o.Spec.PodCIDR != n.Spec.PodCIDR
	}}
}

// needsDeployments: cocoWorkload moves the namespace's existing Deployments to its RuntimeClass.
func needsDeployments(rules []intentv1alpha1.NimbusRules) bool {
	return slices.ContainsFunc(rules, func(r intentv1alpha1.NimbusRules) bool { return r.ID == intent.CocoWorkload })
}

func needsNodes(rules []intentv1alpha1.NimbusRules) bool {
	return slices.ContainsFunc(rules, func(r intentv1alpha1.NimbusRules) bool {
		return slices.Contains(intent.Implementations[r.ID], intent.NetworkPolicy)
	})
}

// Reconcile brings one NimbusPolicy's engine policies to what its rules generate.
func (r *policyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	np := &intentv1alpha1.NimbusPolicy{}
	err := r.client.Get(ctx, req.NamespacedName, np)
	if err != nil || !np.DeletionTimestamp.IsZero() || !madeByBinding(np, "SecurityIntentBinding", "ClusterSecurityIntentBinding") {
		// Gone, going (its policies go with it: garbage collection), or hand-made (as Nimbus's
		// adapters, generate nothing for it): nothing to report, nothing to wait for.
		r.deferred.forget(req.NamespacedName)
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	before := np.DeepCopy()
	earlier := r.deferred.unreported(np)
	in, err := r.inputs(ctx, np.Namespace, np.Spec.NimbusRules)
	var a intent.Applied
	if err == nil {
		a, err = r.applyPolicies(ctx, np.UID, intent.ForNimbusPolicy(np, in), slices.Concat(np.Status.Policies, earlier.entries), np.Namespace, namespacedKinds)
	}
	if r.deferred.passed(np, earlier, a, err) {
		return reconcile.Result{}, nil // enforcement first: reported once its binding is enforced (reports.go)
	}
	a.Changes = slices.Concat(earlier.changes, a.Changes)
	o := r.report(np, &np.Status, a, err, intent.Unenforced(np.Spec.NimbusRules, intent.ClusterGenerated(np)))
	return r.step().End(ctx, np, before, status.Reported{Conditions: &np.Status.Conditions, ObservedGeneration: &np.Status.ObservedGeneration}, o)
}

// madeByBinding reports whether a binding of one of the kinds controls obj: only what bindings make
// becomes engine policies, so whoever may create a NimbusPolicy cannot have the controller write
// Kyverno or NetworkPolicies for them.
func madeByBinding(obj metav1.Object, kinds ...string) bool {
	return slices.ContainsFunc(kinds, func(kind string) bool { return controllerNamed(obj, kind) != "" })
}

// inputs are the cluster facts the rules' policies need: the nodes' pod ranges for
// NetworkPolicies.
func (r *policyReconciler) inputs(ctx context.Context, namespace string, rules []intentv1alpha1.NimbusRules) (intent.Inputs, error) {
	in := intent.Inputs{Engines: r.engines.available}
	if needsNodes(rules) {
		nodes := &corev1.NodeList{}
		if err := r.nodes.List(ctx, nodes); err != nil {
			return in, err
		}
		slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
		for _, n := range nodes.Items {
			in.PodCIDRs = append(in.PodCIDRs, n.Spec.PodCIDR)
		}
	}
	if needsDeployments(rules) {
		list := deploymentMetadataList()
		if err := r.deployments.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return in, err
		}
		for _, d := range list.Items {
			in.Deployments = append(in.Deployments, intent.Workload{Name: d.Name, Labels: d.Labels})
		}
	}
	return in, nil
}

// report writes the Nimbus status fields of a (Cluster)NimbusPolicy, with one Event saying what
// changed, and returns the outcome (for the status step).
func (b *base) report(obj client.Object, st *intentv1alpha1.NimbusPolicyStatus, a intent.Applied, err error, unenforced []string) status.Outcome {
	var o status.Outcome
	if err != nil {
		o = status.Transient("ApplyFailed", err.Error(), err)
	} else {
		switch v := a.Verdict(unenforced); v.Readiness {
		case intent.NeedsPerson:
			recheck := conflictRetry
			if v.Reason == "EngineNotInstalled" {
				recheck = engineRecheck
			}
			o = status.WaitsForPerson(v.Reason, v.Message, recheck)
		case intent.WaitingForEngine:
			// The engine's status write wakes the policy (its watch); the recheck covers an
			// engine that is installed but not running.
			o = status.Progressing(v.Reason, v.Message, engineRecheck).Silenced() // expected until the engine reports: no Warning
		default:
			o = status.Healthy(v.Reason, v.Message, 0)
		}
	}
	switch {
	case (o.Ready || o.Quiet) && status.ReadyReason(st.Conditions) == "" && a.OnlyCreated():
		// Its first generation, made with it (in force or waiting for its engine): the binding's
		// Event (NimbusPolicyCreated, a cluster binding's Bound) says so, and
		// status.adapterPolicies lists what was made.
		o = o.Silenced()
	case len(a.Changes) > 0:
		b.recorder.Eventf(obj, nil, corev1.EventTypeNormal, "PoliciesChanged", "Generate", "%s", strings.Join(a.Changes, "; "))
		if o.Ready {
			o = o.Silenced() // the Event above says it
		}
	}
	if err == nil && (!slices.Equal(st.Policies, a.Entries) || st.Status != intentv1alpha1.StatusCreated) {
		st.Policies = a.Entries
		st.NumberOfAdapterPolicies = int32(len(a.Entries))
		st.Status = intentv1alpha1.StatusCreated
		st.LastUpdated = b.now()
	}
	return o
}

// clusterPolicyReconciler generates the cluster-wide engine policies of each ClusterNimbusPolicy.
type clusterPolicyReconciler struct {
	*base
	engineWatch
}

func (r *clusterPolicyReconciler) setup(mgr ctrl.Manager, opts controller.Options, engines []source.SyncingSource) (controller.Controller, error) {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range engines {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("clusternimbuspolicy").
		For(&intentv1alpha1.ClusterNimbusPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.all, &handler.EnqueueRequestForObject{})).
		WithOptions(opts).
		Build(r)
}

// Reconcile brings one ClusterNimbusPolicy's cluster-wide policies to what its rules generate.
func (r *clusterPolicyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cnp := &intentv1alpha1.ClusterNimbusPolicy{}
	if err := r.client.Get(ctx, req.NamespacedName, cnp); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !cnp.DeletionTimestamp.IsZero() || !madeByBinding(cnp, "ClusterSecurityIntentBinding") {
		return reconcile.Result{}, nil
	}
	before := cnp.DeepCopy()
	a, err := r.applyPolicies(ctx, cnp.UID, intent.ForClusterNimbusPolicy(cnp), cnp.Status.Policies, "", clusterKinds)
	o := r.report(cnp, &cnp.Status, a, err, intent.Unenforced(cnp.Spec.NimbusRules, true))
	return r.step().End(ctx, cnp, before, status.Reported{Conditions: &cnp.Status.Conditions, ObservedGeneration: &cnp.Status.ObservedGeneration}, o)
}
