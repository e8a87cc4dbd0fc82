package intents

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// specOrLabels passes creations, spec changes and label changes (a binding's labels are copied
// onto what it generates).
func specOrLabels() predicate.Predicate {
	return predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})
}

// intentReconciler shows each SecurityIntent's id and action in its status, as Nimbus does.
type intentReconciler struct{ *base }

func (r *intentReconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	return builder.ControllerManagedBy(mgr).
		Named("securityintent").
		For(&intentv1alpha1.SecurityIntent{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(opts).
		Complete(r)
}

// Reconcile writes one SecurityIntent's status.
func (r *intentReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	si := &intentv1alpha1.SecurityIntent{}
	if err := r.client.Get(ctx, req.NamespacedName, si); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	before := si.DeepCopy()
	in := si.Spec.Intent
	si.Status.ID, si.Status.Action, si.Status.Status = in.ID, in.Action, intentv1alpha1.StatusCreated
	si.Status.ObservedGeneration = si.Generation
	engines := intent.Implementations[in.ID]
	msg := "enforced by " + joinEngines(engines)
	if len(engines) == 0 {
		msg = "no engine implements " + in.ID + ": bindings accept it, nothing enforces it"
	}
	o := status.Healthy("Accepted", msg, 0)
	status.Report(r.recorder, si, &si.Status.Conditions, si.Generation, o)
	if err := r.writeStatus(ctx, si, !equality.Semantic.DeepEqual(before.Status, si.Status)); err != nil {
		return reconcile.Result{}, err
	}
	return o.Result()
}

func joinEngines(es []intent.Engine) string {
	names := make([]string, 0, len(es))
	for _, e := range es {
		names = append(names, string(e))
	}
	return strings.Join(names, ", ")
}

// intentsOf reads the SecurityIntents a binding names (those that exist).
func (b *base) intentsOf(ctx context.Context, names []intentv1alpha1.MatchIntent) (map[string]*intentv1alpha1.SecurityIntent, error) {
	out := map[string]*intentv1alpha1.SecurityIntent{}
	for _, m := range names {
		si := &intentv1alpha1.SecurityIntent{}
		err := b.client.Get(ctx, client.ObjectKey{Name: m.Name}, si)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[m.Name] = si
	}
	return out, nil
}

// bindingsOf maps a SecurityIntent to the bindings (of list's kind) that name it.
func (b *base) bindingsOf(list client.ObjectList) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := b.client.List(ctx, l, client.MatchingFields{indexIntents: obj.GetName()}); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		_ = forEach(l, func(o client.Object) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
		})
		return reqs
	}
}

// ensurePolicy creates want, or updates the existing object when its labels, spec or controller
// differ. An existing object controlled by someone else is left alone: false.
//
// made says the owner's status lists want as generated. The status is read through the guarded
// client, so it is never older than our own last write of it: when it says so and the cache shows
// no such object, the cache is behind the create that made it (or someone deleted it since), and
// the API server is asked before creating, rather than repeating the create for a refusal.
func (b *base) ensurePolicy(ctx context.Context, want, cur client.Object, owner metav1.Object, made bool, same func() bool, copySpec func()) (bool, string, error) {
	err := b.client.Get(ctx, client.ObjectKeyFromObject(want), cur)
	if apierrors.IsNotFound(err) && made {
		err = b.apiReader.Get(ctx, client.ObjectKeyFromObject(want), cur)
	}
	if apierrors.IsNotFound(err) {
		err = b.client.Create(ctx, want)
		if err == nil {
			return true, "created", nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, "", err
		}
		// Made by a reconcile the cache does not show yet: compare with the API server's copy.
		err = b.apiReader.Get(ctx, client.ObjectKeyFromObject(want), cur)
	}
	if err != nil {
		return false, "", err
	}
	if ref := metav1.GetControllerOf(cur); ref == nil || ref.UID != owner.GetUID() {
		return false, "", nil
	}
	if same() && equality.Semantic.DeepEqual(cur.GetLabels(), want.GetLabels()) {
		return true, "", nil
	}
	copySpec()
	cur.SetLabels(want.GetLabels())
	if err := b.client.Update(ctx, cur); err != nil {
		return false, "", err
	}
	return true, "updated", nil
}

// bindingReconciler makes each SecurityIntentBinding's NimbusPolicy: same name and namespace,
// the binding's labels, one rule per existing intent in binding order.
type bindingReconciler struct{ *base }

func (r *bindingReconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	return builder.ControllerManagedBy(mgr).
		Named("securityintentbinding").
		For(&intentv1alpha1.SecurityIntentBinding{}, builder.WithPredicates(specOrLabels())).
		Owns(&intentv1alpha1.NimbusPolicy{}, builder.WithPredicates(specOrLabels(), notCreated())).
		Watches(&intentv1alpha1.SecurityIntent{}, handler.EnqueueRequestsFromMapFunc(r.bindingsOf(&intentv1alpha1.SecurityIntentBindingList{})),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(opts).
		Complete(r)
}

// Reconcile brings one binding's NimbusPolicy to its intents.
func (r *bindingReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	sib := &intentv1alpha1.SecurityIntentBinding{}
	if err := r.client.Get(ctx, req.NamespacedName, sib); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !sib.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	before := sib.DeepCopy()
	o, err := r.bind(ctx, sib)
	return r.reportBinding(ctx, sib, &sib.Status.ObservedGeneration, &sib.Status.Conditions, o, err,
		func() bool { return !equality.Semantic.DeepEqual(before.Status, sib.Status) })
}

// reportBinding ends a binding's reconcile: an error shows as Error (and backs off), the outcome
// goes into the conditions, and the status is written when changed says it changed.
func (b *base) reportBinding(ctx context.Context, obj client.Object, observed *int64, conds *[]metav1.Condition,
	o status.Outcome, err error, changed func() bool) (reconcile.Result, error) {
	if err != nil {
		o = status.Transient("Error", err.Error(), err)
	}
	*observed = obj.GetGeneration()
	status.Report(b.recorder, obj, conds, obj.GetGeneration(), o)
	if err := b.writeStatus(ctx, obj, changed()); err != nil {
		return reconcile.Result{}, err
	}
	return o.Result()
}

func (r *bindingReconciler) bind(ctx context.Context, sib *intentv1alpha1.SecurityIntentBinding) (status.Outcome, error) {
	intents, err := r.intentsOf(ctx, sib.Spec.Intents)
	if err != nil {
		return status.Outcome{}, err
	}
	rules, bound, missing := intent.Rules(sib.Spec.Intents, intents)
	st := &sib.Status
	setBound := func(policy string) {
		if st.Status != intentv1alpha1.StatusCreated || st.NimbusPolicy != policy || !slices.Equal(st.BoundIntents, bound) {
			st.LastUpdated = r.now()
		}
		st.Status, st.NimbusPolicy, st.BoundIntents, st.NumberOfBoundIntents = intentv1alpha1.StatusCreated, policy, bound, int32(len(bound))
	}
	selector, err := intent.CELSelector(sib.Spec.CEL, sib.Spec.Selector.WorkloadSelector.MatchLabels)
	if err != nil {
		// A person's mistake in an edit: what the binding generated before keeps protecting its
		// workloads until it is fixed.
		return status.WaitsForPerson("InvalidCEL", err.Error()+"; what was generated before is left as it was", 0), nil //nolint:nilerr // reported in status, not retried
	}
	if len(rules) == 0 {
		// Nothing to bind: what was generated before goes.
		np := &intentv1alpha1.NimbusPolicy{}
		err := r.client.Get(ctx, client.ObjectKey{Namespace: sib.Namespace, Name: sib.Name}, np)
		if err == nil && metav1.IsControlledBy(np, sib) {
			if err := r.client.Delete(ctx, np); client.IgnoreNotFound(err) != nil {
				return status.Outcome{}, err
			}
		} else if client.IgnoreNotFound(err) != nil {
			return status.Outcome{}, err
		}
		setBound("")
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"no named SecurityIntent exists (%s); the NimbusPolicy is made when one does", strings.Join(missing, ", ")), 0), nil
	}
	want := &intentv1alpha1.NimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: sib.Name, Namespace: sib.Namespace, Labels: sib.Labels},
		Spec:       intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: selector}, NimbusRules: rules},
	}
	if err := controllerutil.SetControllerReference(sib, want, r.client.Scheme()); err != nil {
		return status.Outcome{}, err
	}
	cur := &intentv1alpha1.NimbusPolicy{}
	ok, did, err := r.ensurePolicy(ctx, want, cur, sib, st.NimbusPolicy == sib.Name,
		func() bool { return equality.Semantic.DeepEqual(cur.Spec, want.Spec) },
		func() { cur.Spec = want.Spec })
	if inTerminatingNamespace(err) {
		setBound("")
		return status.Progressing("NamespaceTerminating", "the namespace is being deleted", 0), nil
	}
	if err != nil {
		return status.Outcome{}, err
	}
	if !ok {
		setBound("")
		return status.WaitsForPerson("Conflict", fmt.Sprintf(
			"NimbusPolicy %s/%s exists and was not generated from this binding; it is left alone", sib.Namespace, sib.Name), conflictRetry), nil
	}
	if did != "" {
		r.recorder.Eventf(sib, nil, corev1.EventTypeNormal, "NimbusPolicy"+strings.ToUpper(did[:1])+did[1:], "Bind",
			"%s NimbusPolicy %s with %d rules", did, sib.Name, len(rules))
	}
	setBound(sib.Name)
	if len(missing) > 0 {
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"SecurityIntent %s does not exist; bound: %s", strings.Join(missing, ", "), strings.Join(bound, ", ")), 0), nil
	}
	o := status.Healthy("Bound", fmt.Sprintf("NimbusPolicy %s with %d rules", sib.Name, len(rules)), 0)
	if did != "" {
		o = o.Silenced()
	}
	return o, nil
}

func forEach(list client.ObjectList, f func(client.Object)) error {
	return meta.EachListItem(list, func(o runtime.Object) error {
		f(o.(client.Object))
		return nil
	})
}
