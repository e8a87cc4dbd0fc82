package intents

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// clusterBindingReconciler makes each ClusterSecurityIntentBinding's ClusterNimbusPolicy (same
// name) and a NimbusPolicy nimbus-ctlr-gen-<binding> in every namespace it selects.
type clusterBindingReconciler struct{ *base }

func (r *clusterBindingReconciler) setup(mgr ctrl.Manager, opts controller.Options, impact []source.Source) error {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range impact {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("clustersecurityintentbinding").
		For(&intentv1alpha1.ClusterSecurityIntentBinding{}, builder.WithPredicates(specOrLabels())).
		Owns(&intentv1alpha1.ClusterNimbusPolicy{}, builder.WithPredicates(predicate.Or(specOrLabels(), status.ReadyChanged()), notCreated())).
		// Its namespaces' NimbusPolicies: edits and deletions at once, readiness changes coalesced
		// (hundreds report within a second when the binding is made).
		Watches(&intentv1alpha1.NimbusPolicy{}, readinessCoalesced(controllingClusterBinding),
			builder.WithPredicates(predicate.Or(specOrLabels(), status.ReadyChanged()), notCreated())).
		Watches(&intentv1alpha1.SecurityIntent{}, handler.EnqueueRequestsFromMapFunc(r.bindingsOf(&intentv1alpha1.ClusterSecurityIntentBindingList{})),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Namespaces that appear, start terminating or go.
		WatchesRawSource(source.Kind[client.Object](r.namespaces, namespaceMetadata(),
			handler.EnqueueRequestsFromMapFunc(r.selecting), namespaceLifecycle())).
		WithOptions(opts).
		Complete(r)
}

// controllingClusterBinding maps a NimbusPolicy to the ClusterSecurityIntentBinding that controls
// it, if one does.
func controllingClusterBinding(_ context.Context, obj client.Object) []reconcile.Request {
	name := cluster.ControllerNamed(obj, "ClusterSecurityIntentBinding")
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: name}}}
}

func namespaceLifecycle() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
}

// selecting maps a Namespace to the cluster bindings whose selector names it.
func (r *clusterBindingReconciler) selecting(ctx context.Context, ns client.Object) []reconcile.Request {
	list := &intentv1alpha1.ClusterSecurityIntentBindingList{}
	if err := r.client.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, b := range list.Items {
		if intent.Selects(b.Spec.Selector.NsSelector, ns.GetName()) || slices.Contains(b.Status.NimbusPolicyNamespaces, ns.GetName()) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
		}
	}
	return reqs
}

// Reconcile brings one cluster binding's policies to its intents and namespaces.
func (r *clusterBindingReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	csib := &intentv1alpha1.ClusterSecurityIntentBinding{}
	if err := r.client.Get(ctx, req.NamespacedName, csib); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !csib.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	before := csib.DeepCopy()
	o, err := r.bind(ctx, csib)
	if err == nil {
		err = keepImpact(&csib.Status.Impact)(r.bindingImpact(ctx, "", csib.Name, csib.Spec.Intents))
	}
	return r.reportBinding(ctx, csib, before, status.Reported{Conditions: &csib.Status.Conditions, ObservedGeneration: &csib.Status.ObservedGeneration}, o, err)
}

func (r *clusterBindingReconciler) bind(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding) (status.Outcome, error) {
	intents, err := r.intentsOf(ctx, csib.Spec.Intents)
	if err != nil {
		return status.Outcome{}, err
	}
	rules, bound, missing := intent.Rules(csib.Spec.Intents, intents)
	var selected []string
	if len(rules) > 0 {
		if selected, err = r.selectedNamespaces(ctx, csib.Spec.Selector.NsSelector); err != nil {
			return status.Outcome{}, err
		}
	}
	var conflicts []string
	policy := ""
	var clusterPolicy client.Object // as stored
	var clusterDid owned.Outcome
	if len(rules) == 0 {
		if err := r.deleteClusterPolicy(ctx, csib); err != nil {
			return status.Outcome{}, err
		}
	} else {
		did, stored, err := r.ensureClusterPolicy(ctx, csib, rules)
		if err != nil {
			return status.Outcome{}, err
		}
		if did == owned.Taken {
			conflicts = append(conflicts, "ClusterNimbusPolicy "+csib.Name)
		} else {
			policy, clusterPolicy, clusterDid = csib.Name, stored, did
		}
	}
	nsp, err := r.ensureNamespacePolicies(ctx, csib, rules, selected)
	if err != nil {
		return status.Outcome{}, err
	}
	namespaces := nsp.have
	conflicts = append(conflicts, nsp.conflicts...)

	st := &csib.Status
	if st.Status != intentv1alpha1.StatusCreated || st.ClusterNimbusPolicy != policy || !slices.Equal(st.BoundIntents, bound) ||
		!slices.Equal(st.NimbusPolicyNamespaces, namespaces) {
		st.LastUpdated = r.now()
	}
	st.Status, st.ClusterNimbusPolicy, st.BoundIntents, st.NumberOfBoundIntents = intentv1alpha1.StatusCreated, policy, bound, int32(len(bound))
	st.NimbusPolicyNamespaces, st.NumberOfNimbusPolicies = namespaces, int32(len(namespaces))

	switch {
	case len(nsp.failed) > 0:
		// The others are written; these are retried with backoff, and the message names them.
		err := nsp.err()
		msg := err.Error()
		if len(conflicts) > 0 {
			msg += "; " + strings.Join(conflicts, ", ") + " exist and were not generated from this binding; they are left alone"
		}
		return status.Transient("Error", msg, err), nil
	case len(conflicts) > 0:
		return status.WaitsForPerson("Conflict", strings.Join(conflicts, ", ")+" exist and were not generated from this binding; they are left alone", cluster.ConflictRetry), nil
	case len(rules) == 0:
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"no named SecurityIntent exists (%s); the policies are made when one does", strings.Join(missing, ", ")), 0), nil
	case len(missing) > 0:
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"SecurityIntent %s does not exist; bound: %s", strings.Join(missing, ", "), strings.Join(bound, ", ")), 0), nil
	}
	// Bound is not enough: Ready means every policy it made is in force.
	if o := policyInForce(clusterPolicy, clusterDid); o != nil {
		return *o, nil
	}
	if o, err := r.namespacePoliciesInForce(ctx, csib); o != nil || err != nil {
		return *o, err
	}
	st.EnforcedIntents = enforcedIntents(bound, intents)
	o := status.Healthy("Bound", fmt.Sprintf("ClusterNimbusPolicy %s with %d rules; NimbusPolicies in %d namespaces, in force",
		csib.Name, len(rules), len(namespaces)), 0)
	if status.ReadyReason(csib.Status.Conditions) == status.WaitingFor {
		o = o.Silenced() // being in force is a new binding's expected next step
	}
	return o, nil
}

// namespacePoliciesInForce is the outcome of a cluster binding one of whose per-namespace
// NimbusPolicies is not Ready (the first, by namespace): nil when all are.
func (r *clusterBindingReconciler) namespacePoliciesInForce(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding) (*status.Outcome, error) {
	made := &intentv1alpha1.NimbusPolicyList{}
	if err := r.client.List(ctx, made, client.MatchingFields{cluster.IndexController: string(csib.UID)}); err != nil {
		return &status.Outcome{}, err
	}
	slices.SortFunc(made.Items, func(a, b intentv1alpha1.NimbusPolicy) int { return strings.Compare(a.Namespace, b.Namespace) })
	for _, np := range made.Items {
		if o := status.Dependent("NimbusPolicy "+np.Namespace+"/"+np.Name, np.Status.Conditions, np.Generation); o != nil {
			if o.Reason == status.WaitingFor {
				q := o.Silenced()
				o = &q
			}
			return o, nil
		}
	}
	return nil, nil
}

// selectedNamespaces are the existing namespaces the selector picks (never kube-system, never one
// being deleted), sorted.
func (r *clusterBindingReconciler) selectedNamespaces(ctx context.Context, sel intentv1alpha1.NamespaceSelector) ([]string, error) {
	list := namespaceMetadataList()
	if err := r.namespaces.List(ctx, list); err != nil {
		return nil, err
	}
	all := make([]intent.Namespace, 0, len(list.Items))
	for _, ns := range list.Items {
		all = append(all, intent.Namespace{Name: ns.Name, Terminating: !ns.DeletionTimestamp.IsZero()})
	}
	return intent.SelectNamespaces(sel, all), nil
}

func (r *clusterBindingReconciler) ensureClusterPolicy(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding, rules []intentv1alpha1.NimbusRules) (owned.Outcome, client.Object, error) {
	sel := csib.Spec.Selector
	want := &intentv1alpha1.ClusterNimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: csib.Name, Labels: csib.Labels},
		Spec: intentv1alpha1.ClusterNimbusPolicySpec{
			NodeSelector: sel.NodeSelector, NsSelector: sel.NsSelector, WorkloadSelector: sel.WorkloadSelector, NimbusRules: rules,
		},
	}
	if err := controllerutil.SetControllerReference(csib, want, r.client.Scheme()); err != nil {
		return "", nil, err
	}
	return r.ensurePolicy(ctx, want, csib.Status.ClusterNimbusPolicy == csib.Name)
}

func (r *clusterBindingReconciler) deleteClusterPolicy(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding) error {
	cnp := &intentv1alpha1.ClusterNimbusPolicy{}
	err := r.client.Get(ctx, client.ObjectKey{Name: csib.Name}, cnp)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !metav1.IsControlledBy(cnp, csib) {
		return nil
	}
	return client.IgnoreNotFound(r.client.Delete(ctx, cnp))
}

// namespaceWriters bounds the NimbusPolicies one cluster binding's reconcile writes (or deletes)
// at once. Each NimbusPolicy it writes is two more writes for the policy controller (its engine
// policy, its status), whose --intents-concurrency workers (16) then keep pace with 8 writers; a
// binding writing faster only queues them and takes the API server from them (measured: 16
// writers left NimbusPolicies 4.6 s in the queue and the ratio to the bare client no better).
const namespaceWriters = 8

// namespacePolicies is what bringing a cluster binding's per-namespace NimbusPolicies about found
// and did.
type namespacePolicies struct {
	have      []string         // the namespaces holding one, sorted
	conflicts []string         // NimbusPolicies in the way that the binding does not control
	failed    map[string]error // by namespace: a write or read that failed (retried with backoff)
}

// err is the failures, naming their namespaces (the first few, sorted), or nil.
func (p namespacePolicies) err() error {
	if len(p.failed) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(p.failed))
	const shown = 3
	parts := make([]string, 0, min(len(names), shown))
	for _, ns := range names[:min(len(names), shown)] {
		parts = append(parts, fmt.Sprintf("namespace %s: %v", ns, p.failed[ns]))
	}
	msg := strings.Join(parts, "; ")
	if len(names) > shown {
		msg += fmt.Sprintf("; and %d more", len(names)-shown)
	}
	return fmt.Errorf("the NimbusPolicy of %d selected namespaces is not written (the others are; retried with backoff): %s", len(names), msg)
}

// ensureNamespacePolicies makes the binding's NimbusPolicy in each selected namespace and deletes
// those in namespaces no longer selected (all of them when no rule is left), namespaceWriters at a
// time. A namespace that fails does not hold up the others: its error is kept, by namespace, and
// the rest are written.
func (r *clusterBindingReconciler) ensureNamespacePolicies(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding, rules []intentv1alpha1.NimbusRules, selected []string) (namespacePolicies, error) {
	name := intent.ClusterPolicyNamePrefix + csib.Name
	stale, err := r.stalePolicies(ctx, csib, name, selected)
	if err != nil {
		return namespacePolicies{}, err
	}
	listed := make(map[string]bool, len(csib.Status.NimbusPolicyNamespaces))
	for _, ns := range csib.Status.NimbusPolicyNamespaces {
		listed[ns] = true
	}

	// Each namespace's NimbusPolicy is an object of its own: written at once, reported in order.
	results := make([]namespaceResult, len(selected))
	deleted := make([]error, len(stale))
	defer r.deferred.writingFor(csib.UID)() // their reports wait for the pass (reports.go)
	var g errgroup.Group
	g.SetLimit(namespaceWriters)
	for i, np := range stale {
		g.Go(func() error {
			deleted[i] = client.IgnoreNotFound(r.client.Delete(ctx, np, client.Preconditions{UID: new(np.UID)}))
			return nil
		})
	}
	for i, ns := range selected {
		g.Go(func() error {
			results[i] = r.ensureNamespacePolicy(ctx, csib, name, ns, rules, listed[ns])
			return nil
		})
	}
	_ = g.Wait()

	out := namespacePolicies{failed: map[string]error{}}
	for i, err := range deleted {
		if err != nil {
			out.failed[stale[i].Namespace] = fmt.Errorf("deleting NimbusPolicy %s: %w", stale[i].Name, err)
		}
	}
	for i, ns := range selected {
		res := results[i]
		switch {
		case res.err != nil:
			out.failed[ns] = res.err
			if listed[ns] {
				out.have = append(out.have, ns) // it was made before; the failure is a later write's
			}
		case res.conflict:
			out.conflicts = append(out.conflicts, "NimbusPolicy "+ns+"/"+name)
		case res.ok:
			out.have = append(out.have, ns)
		}
	}
	return out, nil
}

// stalePolicies are the cluster binding's NimbusPolicies that are no longer wanted: in a
// namespace no longer selected, or of another name.
func (r *clusterBindingReconciler) stalePolicies(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding, name string, selected []string) ([]*intentv1alpha1.NimbusPolicy, error) {
	made := &intentv1alpha1.NimbusPolicyList{}
	if err := r.client.List(ctx, made, client.MatchingFields{cluster.IndexController: string(csib.UID)}); err != nil {
		return nil, err
	}
	isSelected := make(map[string]bool, len(selected))
	for _, ns := range selected {
		isSelected[ns] = true
	}
	var stale []*intentv1alpha1.NimbusPolicy
	for i := range made.Items {
		if np := &made.Items[i]; np.Name != name || !isSelected[np.Namespace] {
			stale = append(stale, np)
		}
	}
	return stale, nil
}

// namespaceResult is what writing one namespace's NimbusPolicy did.
type namespaceResult struct {
	ok, conflict, gone bool
	err                error
}

// ensureNamespacePolicy writes the cluster binding's NimbusPolicy in ns; listed says the
// binding's status lists it as made.
func (r *clusterBindingReconciler) ensureNamespacePolicy(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding, name, ns string, rules []intentv1alpha1.NimbusRules, listed bool) namespaceResult {
	want := &intentv1alpha1.NimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: csib.Labels},
		Spec:       intentv1alpha1.NimbusPolicySpec{Selector: csib.Spec.Selector.WorkloadSelector, NimbusRules: rules},
	}
	did, err := owned.Unchanged, controllerutil.SetControllerReference(csib, want, r.client.Scheme())
	if err == nil {
		created := r.deferred.creating(csib.UID, client.ObjectKeyFromObject(want))
		did, _, err = r.ensurePolicy(ctx, want, listed)
		created(err == nil && did == owned.Created)
	}
	switch {
	case apierrors.IsNotFound(err) || did == owned.Terminating:
		return namespaceResult{gone: true} // the namespace went meanwhile
	case err != nil:
		return namespaceResult{err: err}
	case did == owned.Taken:
		return namespaceResult{conflict: true}
	}
	return namespaceResult{ok: true}
}
