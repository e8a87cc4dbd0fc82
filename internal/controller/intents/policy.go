package intents

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// namespacedKinds are the engine kinds a NimbusPolicy generates; clusterKinds a ClusterNimbusPolicy's
// (assessTLS's CronJob and ConfigMap, in K8TLS's namespace, included).
var (
	namespacedKinds = []schema.GroupVersionKind{intent.KubeArmorPolicyKind, intent.NetworkPolicyKind, intent.KyvernoPolicyKind}
	clusterKinds    = []schema.GroupVersionKind{intent.KyvernoClusterPolicyKind, intent.CronJobKind, intent.ConfigMapKind}
)

// policyReconciler generates the engine policies of each NimbusPolicy.
type policyReconciler struct {
	*base
}

func (r *policyReconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range r.engineSources(mgr, namespacedKinds, &intentv1alpha1.NimbusPolicy{}, &intentv1alpha1.NimbusPolicyList{}) {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("nimbuspolicy").
		For(&intentv1alpha1.NimbusPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(r.deferred.released()).
		// A node's pod range is in the NetworkPolicies.
		WatchesRawSource(source.Kind[client.Object](r.nodes, &corev1.Node{},
			handler.EnqueueRequestsFromMapFunc(r.needing(needsNodes)), podCIDRChanged())).
		// A Deployment that appears, goes or changes labels is or is no longer a cocoWorkload target.
		WatchesRawSource(source.Kind[client.Object](r.deployments, deploymentMetadata(),
			handler.EnqueueRequestsFromMapFunc(r.needing(needsDeployments)), predicate.Or[client.Object](predicate.LabelChangedPredicate{}, createOrDelete()))).
		WithOptions(opts).
		Complete(r)
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
	return slices.ContainsFunc(kinds, func(kind string) bool { return cluster.ControllerNamed(obj, kind) != "" })
}

// inputs are the cluster facts the rules' policies need: the nodes' pod ranges for
// NetworkPolicies.
func (r *policyReconciler) inputs(ctx context.Context, namespace string, rules []intentv1alpha1.NimbusRules) (intent.Inputs, error) {
	in := intent.Inputs{Engines: r.engines.Available}
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
			recheck := cluster.ConflictRetry
			if v.Reason == "EngineNotInstalled" {
				recheck = cluster.EngineRecheck
			}
			o = status.WaitsForPerson(v.Reason, v.Message, recheck)
		case intent.WaitingForEngine:
			// The engine's status write wakes the policy (its watch); the recheck covers an
			// engine that is installed but not running.
			o = status.Progressing(v.Reason, v.Message, cluster.EngineRecheck).Silenced() // expected until the engine reports: no Warning
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
}

func (r *clusterPolicyReconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range r.engineSources(mgr, clusterKinds, &intentv1alpha1.ClusterNimbusPolicy{}, &intentv1alpha1.ClusterNimbusPolicyList{}) {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("clusternimbuspolicy").
		For(&intentv1alpha1.ClusterNimbusPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(opts).
		Complete(r)
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
