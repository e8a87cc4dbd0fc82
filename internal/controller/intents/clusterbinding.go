package intents

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
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
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// clusterBindingReconciler makes each ClusterSecurityIntentBinding's ClusterNimbusPolicy (same
// name) and a NimbusPolicy nimbus-ctlr-gen-<binding> in every namespace it selects.
type clusterBindingReconciler struct{ *base }

func (r *clusterBindingReconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	return builder.ControllerManagedBy(mgr).
		Named("clustersecurityintentbinding").
		For(&intentv1alpha1.ClusterSecurityIntentBinding{}, builder.WithPredicates(specOrLabels())).
		Owns(&intentv1alpha1.ClusterNimbusPolicy{}, builder.WithPredicates(specOrLabels(), notCreated())).
		Owns(&intentv1alpha1.NimbusPolicy{}, builder.WithPredicates(specOrLabels(), notCreated())).
		Watches(&intentv1alpha1.SecurityIntent{}, handler.EnqueueRequestsFromMapFunc(r.bindingsOf(&intentv1alpha1.ClusterSecurityIntentBindingList{})),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Namespaces that appear, start terminating or go.
		WatchesRawSource(source.Kind[client.Object](r.namespaces, namespaceMetadata(),
			handler.EnqueueRequestsFromMapFunc(r.selecting), namespaceLifecycle())).
		WithOptions(opts).
		Complete(r)
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
	return r.reportBinding(ctx, csib, &csib.Status.ObservedGeneration, &csib.Status.Conditions, o, err,
		func() bool { return !equality.Semantic.DeepEqual(before.Status, csib.Status) })
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
	if len(rules) == 0 {
		if err := r.deleteClusterPolicy(ctx, csib); err != nil {
			return status.Outcome{}, err
		}
	} else {
		ok, err := r.ensureClusterPolicy(ctx, csib, rules)
		if err != nil {
			return status.Outcome{}, err
		}
		if ok {
			policy = csib.Name
		} else {
			conflicts = append(conflicts, "ClusterNimbusPolicy "+csib.Name)
		}
	}
	namespaces, nsConflicts, err := r.ensureNamespacePolicies(ctx, csib, rules, selected)
	if err != nil {
		return status.Outcome{}, err
	}
	conflicts = append(conflicts, nsConflicts...)

	st := &csib.Status
	if st.Status != intentv1alpha1.StatusCreated || st.ClusterNimbusPolicy != policy || !slices.Equal(st.BoundIntents, bound) ||
		!slices.Equal(st.NimbusPolicyNamespaces, namespaces) {
		st.LastUpdated = r.now()
	}
	st.Status, st.ClusterNimbusPolicy, st.BoundIntents, st.NumberOfBoundIntents = intentv1alpha1.StatusCreated, policy, bound, int32(len(bound))
	st.NimbusPolicyNamespaces, st.NumberOfNimbusPolicies = namespaces, int32(len(namespaces))

	switch {
	case len(conflicts) > 0:
		return status.WaitsForPerson("Conflict", strings.Join(conflicts, ", ")+" exist and were not generated from this binding; they are left alone", conflictRetry), nil
	case len(rules) == 0:
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"no named SecurityIntent exists (%s); the policies are made when one does", strings.Join(missing, ", ")), 0), nil
	case len(missing) > 0:
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"SecurityIntent %s does not exist; bound: %s", strings.Join(missing, ", "), strings.Join(bound, ", ")), 0), nil
	}
	return status.Healthy("Bound", fmt.Sprintf("ClusterNimbusPolicy %s with %d rules; NimbusPolicies in %d namespaces",
		csib.Name, len(rules), len(namespaces)), 0), nil
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

func (r *clusterBindingReconciler) ensureClusterPolicy(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding, rules []intentv1alpha1.NimbusRules) (bool, error) {
	sel := csib.Spec.Selector
	want := &intentv1alpha1.ClusterNimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: csib.Name, Labels: csib.Labels},
		Spec: intentv1alpha1.ClusterNimbusPolicySpec{
			NodeSelector: sel.NodeSelector, NsSelector: sel.NsSelector, WorkloadSelector: sel.WorkloadSelector, NimbusRules: rules,
		},
	}
	if err := controllerutil.SetControllerReference(csib, want, r.client.Scheme()); err != nil {
		return false, err
	}
	ok, _, err := r.ensurePolicy(ctx, want, csib.Status.ClusterNimbusPolicy == csib.Name)
	return ok, err
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

// ensureNamespacePolicies makes the binding's NimbusPolicy in each selected namespace and deletes
// those in namespaces no longer selected (all of them when no rule is left). It returns the
// namespaces holding one, sorted.
func (r *clusterBindingReconciler) ensureNamespacePolicies(ctx context.Context, csib *intentv1alpha1.ClusterSecurityIntentBinding, rules []intentv1alpha1.NimbusRules, selected []string) ([]string, []string, error) {
	name := intent.ClusterPolicyNamePrefix + csib.Name
	made := &intentv1alpha1.NimbusPolicyList{}
	if err := r.client.List(ctx, made, client.MatchingFields{indexController: string(csib.UID)}); err != nil {
		return nil, nil, err
	}
	for i := range made.Items {
		np := &made.Items[i]
		if np.Name == name && slices.Contains(selected, np.Namespace) {
			continue
		}
		if err := r.client.Delete(ctx, np, client.Preconditions{UID: new(np.UID)}); client.IgnoreNotFound(err) != nil {
			return nil, nil, err
		}
	}
	var have, conflicts []string
	for _, ns := range selected {
		want := &intentv1alpha1.NimbusPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: csib.Labels},
			Spec:       intentv1alpha1.NimbusPolicySpec{Selector: csib.Spec.Selector.WorkloadSelector, NimbusRules: rules},
		}
		if err := controllerutil.SetControllerReference(csib, want, r.client.Scheme()); err != nil {
			return nil, nil, err
		}
		_, did, err := r.ensurePolicy(ctx, want, slices.Contains(csib.Status.NimbusPolicyNamespaces, ns))
		if apierrors.IsNotFound(err) || did == owned.Terminating {
			continue // the namespace went meanwhile
		}
		if err != nil {
			return nil, nil, err
		}
		if did == owned.Taken {
			conflicts = append(conflicts, "NimbusPolicy "+ns+"/"+name)
			continue
		}
		have = append(have, ns)
	}
	return have, conflicts, nil
}
