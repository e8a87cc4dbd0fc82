package intents

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
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

func (r *intentReconciler) setup(mgr ctrl.Manager, opts controller.Options, impact []source.Source) error {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range impact {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("securityintent").
		For(&intentv1alpha1.SecurityIntent{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// An intent is in force when the bindings naming it are: their readiness changes coalesce.
		Watches(&intentv1alpha1.SecurityIntentBinding{}, readinessCoalesced(cluster.IntentsNamed),
			builder.WithPredicates(predicate.Or[client.Object](status.ReadyChanged(), enforcedChanged(), createOrDelete(), predicate.GenerationChangedPredicate{}))).
		Watches(&intentv1alpha1.ClusterSecurityIntentBinding{}, readinessCoalesced(cluster.IntentsNamed),
			builder.WithPredicates(predicate.Or[client.Object](status.ReadyChanged(), enforcedChanged(), createOrDelete(), predicate.GenerationChangedPredicate{}))).
		// Its status lists the exceptions to it.
		Watches(&securityv1alpha1.SecurityIntentException{}, handler.EnqueueRequestsFromMapFunc(exceptionsOf), builder.WithPredicates(exceptionShown())).
		WithOptions(opts).
		Complete(r)
}

// Reconcile writes one SecurityIntent's status: Ready when every binding naming it is (its engine
// policies exist and their engines accepted them), naming the engines that enforce it here.
func (r *intentReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	si := &intentv1alpha1.SecurityIntent{}
	if err := r.client.Get(ctx, req.NamespacedName, si); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	before := si.DeepCopy()
	in := si.Spec.Intent
	si.Status.ID, si.Status.Action, si.Status.Status = in.ID, in.Action, intentv1alpha1.StatusCreated
	o, err := r.intentOutcome(ctx, si)
	if err == nil {
		err = keepImpact(&si.Status.Impact)(r.intentImpact(ctx, si))
	}
	if err == nil {
		si.Status.Exceptions, err = r.intentExceptions(ctx, si.Name)
	}
	if err != nil {
		o = status.Transient("Error", err.Error(), err)
	}
	return r.step().End(ctx, si, before, status.Reported{Conditions: &si.Status.Conditions, ObservedGeneration: &si.Status.ObservedGeneration}, o)
}

// intentOutcome says which engines enforce the intent here and whether the bindings naming it are
// in force.
func (r *intentReconciler) intentOutcome(ctx context.Context, si *intentv1alpha1.SecurityIntent) (status.Outcome, error) {
	id := si.Spec.Intent.ID
	var enforcing, missing, disabled []intent.Engine
	for _, e := range slices.Concat(intent.Implementations[id], intent.ClusterImplementations[id]) {
		switch {
		case slices.Contains(enforcing, e) || slices.Contains(missing, e) || slices.Contains(disabled, e):
		case !r.engines.Enabled(e):
			disabled = append(disabled, e)
		case !r.engines.Has(e):
			missing = append(missing, e)
		default:
			enforcing = append(enforcing, e)
		}
	}
	var notes []string
	if len(missing) > 0 {
		notes = append(notes, "not installed: "+intent.JoinEngines(missing))
	}
	if len(disabled) > 0 {
		notes = append(notes, "disabled by --intents-engines: "+intent.JoinEngines(disabled))
	}
	suffix := ""
	if len(notes) > 0 {
		suffix = " (" + strings.Join(notes, "; ") + ")"
	}
	recheck := time.Duration(0)
	if len(missing) > 0 {
		recheck = cluster.EngineRecheck // its message names engines that may be installed meanwhile
	}
	if len(enforcing) == 0 {
		return status.Healthy("Accepted", "no engine enforces "+id+" here"+suffix+": bindings accept it, nothing enforces it", recheck), nil
	}
	bindings, err := r.bindingsNaming(ctx, si.Name)
	if err != nil {
		return status.Outcome{}, err
	}
	if len(bindings) == 0 {
		return status.Healthy("Accepted", "not bound; "+intent.JoinEngines(enforcing)+" enforce it once bound"+suffix, recheck), nil
	}
	// The status names one binding not in force: a stalled one first (a person must act), else
	// the first by name, so that it changes only when that binding's state does. A binding in
	// force with an earlier generation of the intent (an edit, Audit to Block say, on its way to
	// the engines) is not in force for this one.
	slices.SortFunc(bindings, func(a, b boundBy) int { return strings.Compare(a.what, b.what) })
	var waiting *status.Outcome
	for _, b := range bindings {
		o := status.Dependent(b.what, b.conditions, b.generation)
		if o == nil && b.enforced != si.Generation {
			w := status.Progressing(status.WaitingFor, fmt.Sprintf("%s has not put generation %d of the intent in force yet", b.what, si.Generation), 0)
			o = &w
		}
		switch {
		case o == nil:
		case o.Stalled:
			return *o, nil
		case waiting == nil:
			waiting = o
		}
	}
	if waiting != nil {
		if waiting.Reason == status.WaitingFor {
			return waiting.Silenced(), nil // a binding on its way: no Event
		}
		return *waiting, nil
	}
	return status.Healthy("Accepted", fmt.Sprintf("enforced by %s in %d bindings%s", intent.JoinEngines(enforcing), len(bindings), suffix), recheck), nil
}

// boundBy is what an intent's status reads of a binding naming it.
type boundBy struct {
	what       string
	conditions []metav1.Condition
	generation int64
	enforced   int64 // the intent's generation the binding last had in force (0: none)
}

// enforcedGeneration is the generation of the intent name in a binding's status.enforcedIntents.
func enforcedGeneration(enforced []intentv1alpha1.EnforcedIntent, name string) int64 {
	for _, e := range enforced {
		if e.Name == name {
			return e.Generation
		}
	}
	return 0
}

// enforcedIntents are the bound intents at the generations the bind read: what a binding in force
// enforces.
func enforcedIntents(bound []string, intents map[string]*intentv1alpha1.SecurityIntent) []intentv1alpha1.EnforcedIntent {
	out := make([]intentv1alpha1.EnforcedIntent, 0, len(bound))
	for _, name := range bound {
		if si, ok := intents[name]; ok {
			out = append(out, intentv1alpha1.EnforcedIntent{Name: name, Generation: si.Generation})
		}
	}
	return out
}

// enforcedChanged passes a binding's change of the intent generations it enforces.
func enforcedChanged() predicate.Predicate {
	of := func(o client.Object) []intentv1alpha1.EnforcedIntent {
		switch b := o.(type) {
		case *intentv1alpha1.SecurityIntentBinding:
			return b.Status.EnforcedIntents
		case *intentv1alpha1.ClusterSecurityIntentBinding:
			return b.Status.EnforcedIntents
		}
		return nil
	}
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return !slices.Equal(of(e.ObjectOld), of(e.ObjectNew)) },
	}
}

// bindingsNaming is what the intent's status reads of the bindings naming it.
func (r *intentReconciler) bindingsNaming(ctx context.Context, name string) ([]boundBy, error) {
	sibs, csibs, err := cluster.BindingsNaming(ctx, r.client, name)
	if err != nil {
		return nil, err
	}
	out := make([]boundBy, 0, len(sibs)+len(csibs))
	for _, b := range sibs {
		out = append(out, boundBy{"SecurityIntentBinding " + b.Namespace + "/" + b.Name, b.Status.Conditions, b.Generation, enforcedGeneration(b.Status.EnforcedIntents, name)})
	}
	for _, b := range csibs {
		out = append(out, boundBy{"ClusterSecurityIntentBinding " + b.Name, b.Status.Conditions, b.Generation, enforcedGeneration(b.Status.EnforcedIntents, name)})
	}
	return out, nil
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
		if err := b.client.List(ctx, l, client.MatchingFields{cluster.IndexIntents: obj.GetName()}); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		_ = cluster.ForEach(l, func(o client.Object) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
		})
		return reqs
	}
}

// ensurePolicy creates want (a NimbusPolicy or ClusterNimbusPolicy, with its controller
// reference), or brings the existing one back to it, and returns it as stored. One controlled by
// someone else is left alone (owned.Taken). made says the owner's status lists want as generated
// (owned.Options.Made).
func (b *base) ensurePolicy(ctx context.Context, want client.Object, made bool) (owned.Outcome, client.Object, error) {
	return b.nimbus().Ensure(ctx, want, owned.Options{Made: made, ExactLabels: true})
}

// bindingReconciler makes each SecurityIntentBinding's NimbusPolicy: same name and namespace,
// the binding's labels, one rule per existing intent in binding order.
type bindingReconciler struct{ *base }

func (r *bindingReconciler) setup(mgr ctrl.Manager, opts controller.Options, impact []source.Source) error {
	b := builder.ControllerManagedBy(mgr)
	for _, src := range impact {
		b = b.WatchesRawSource(src)
	}
	return b.
		Named("securityintentbinding").
		For(&intentv1alpha1.SecurityIntentBinding{}, builder.WithPredicates(specOrLabels())).
		Owns(&intentv1alpha1.NimbusPolicy{}, builder.WithPredicates(specOrLabels(), notCreated())).
		// Its NimbusPolicy's report wakes the binding to report in turn, after the work that enforces.
		Watches(&intentv1alpha1.NimbusPolicy{}, toReport("SecurityIntentBinding"), builder.WithPredicates(status.ReadyChanged())).
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
	if err == nil && o.Reason == status.WaitingFor {
		// The NimbusPolicy has not reported on what was just written: its report wakes the
		// binding (readyChanged), whose status is then written once, with what it says. A
		// status saying "waiting" now would be a second write per binding, outdated at once.
		return reconcile.Result{}, nil
	}
	if err == nil {
		err = keepImpact(&sib.Status.Impact)(r.bindingImpact(ctx, sib.Namespace, sib.Name, sib.Spec.Intents))
	}
	return r.reportBinding(ctx, sib, before, status.Reported{Conditions: &sib.Status.Conditions, ObservedGeneration: &sib.Status.ObservedGeneration}, o, err)
}

// reportBinding ends a binding's reconcile (obj, read as before): an error shows as Error (and
// backs off), then the status step.
func (b *base) reportBinding(ctx context.Context, obj, before client.Object, reported status.Reported, o status.Outcome, err error) (reconcile.Result, error) {
	if err != nil {
		o = status.Transient("Error", err.Error(), err)
	}
	return b.step().End(ctx, obj, before, reported, o)
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
	did, stored, err := r.ensurePolicy(ctx, want, st.NimbusPolicy == sib.Name)
	if did == owned.Terminating {
		setBound("")
		return status.Progressing("NamespaceTerminating", "the namespace is being deleted", 0), nil
	}
	if err != nil {
		return status.Outcome{}, err
	}
	if did == owned.Taken {
		setBound("")
		return status.WaitsForPerson("Conflict", fmt.Sprintf(
			"NimbusPolicy %s/%s exists and was not generated from this binding; it is left alone", sib.Namespace, sib.Name), cluster.ConflictRetry), nil
	}
	if did != owned.Unchanged {
		r.recorder.Eventf(sib, nil, corev1.EventTypeNormal, "NimbusPolicy"+strings.ToUpper(string(did[:1]))+string(did[1:]), "Bind",
			"%s NimbusPolicy %s with %d rules", did, sib.Name, len(rules))
	}
	setBound(sib.Name)
	if len(missing) > 0 {
		return status.Progressing("IntentNotFound", fmt.Sprintf(
			"SecurityIntent %s does not exist; bound: %s", strings.Join(missing, ", "), strings.Join(bound, ", ")), 0), nil
	}
	// Bound is not enough: Ready means the NimbusPolicy's engine policies are in force.
	if o := policyInForce(stored, did); o != nil {
		return *o, nil
	}
	st.EnforcedIntents = enforcedIntents(bound, intents)
	o := status.Healthy("Bound", fmt.Sprintf("NimbusPolicy %s with %d rules, in force", sib.Name, len(rules)), 0)
	if r := status.ReadyReason(sib.Status.Conditions); did != owned.Unchanged || r == status.WaitingFor || r == "" {
		o = o.Silenced() // its creation's Event said it; being in force is the expected next step
	}
	return o, nil
}

// policyInForce is the outcome of a binding whose (Cluster)NimbusPolicy, as stored, is not Ready
// for its generation yet: nil when it is. Only a stalled policy (a person must act) is announced on
// the binding; a policy just made or on its way records no Event here (its creation's, and the
// policy's own, say it).
func policyInForce(stored client.Object, did owned.Outcome) *status.Outcome {
	o := status.Dependent(owned.Kind(stored)+" "+client.ObjectKeyFromObject(stored).String(), status.ConditionsOf(stored), stored.GetGeneration())
	if o != nil && (did != owned.Unchanged || !o.Stalled) {
		q := o.Silenced() // on its way (the policy records its own Events): a Warning only when stalled
		o = &q
	}
	return o
}
