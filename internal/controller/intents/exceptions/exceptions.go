// Package exceptions is the intents controller's exceptions part: a SecurityIntentException
// (security.quartermaster.dev, namespaced) exempts some workloads from one SecurityIntent until its
// expiry, with an owner and a reason. It becomes Kyverno's own PolicyException (kyverno.io/v2) in
// the one namespace where Kyverno accepts them (--intents-exception-namespace, Kyverno's
// --exceptionNamespace), naming the intent's Kyverno policies that apply to the exempted
// namespaces, every rule of each.
//
// What the API server cannot check is refused here, the failed check named in the Stalled
// condition, and what an earlier version of the exception wrote is removed: exceptions not enabled
// by the platform, an expiry past or beyond --intents-exception-max-ttl after the exception's
// creation, other namespaces from a namespace the platform has not named
// (--intents-exception-admin-namespaces), nearly every workload of every namespace unless
// --intents-exception-allow-everything, a SecurityIntent that does not exist, or one whose engines
// have nothing to exempt from (KubeArmor and NetworkPolicy have no exception of their own, and
// Kyverno's mutate and generate rules no check: a binding's selector is how their workloads are
// left out). Exceptions exempt from the intents Kyverno validates, the ones its scans report on;
// KubeArmor's run-time half of escapeToHost still applies, and the Ready message says so.
//
// Expiry is enforced here, whatever Kyverno does with it: every outcome of an exception not yet
// expired looks again by its expiry at the latest, every exception is reconciled when a manager
// starts, and at expiry the PolicyException is deleted; the exception stays, Stalled with reason
// Expired, as the record of what was allowed. In the last --intents-exception-expiry-warning it is
// Ready with reason ExpiresSoon and a Warning Event. A sweep at each start deletes the
// PolicyExceptions of exceptions deleted meanwhile, and all those outside the exception namespace
// (the flag changed, or emptied). Kyverno's reports say what it actually skipped: status.exempted
// counts the workloads whose results for those policies are skipped under this PolicyException.
package exceptions

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/go-logr/logr"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// +kubebuilder:rbac:groups=security.quartermaster.dev,resources=securityintentexceptions,verbs=get;list;watch
// +kubebuilder:rbac:groups=security.quartermaster.dev,resources=securityintentexceptions/status,verbs=patch
// +kubebuilder:rbac:groups=kyverno.io,resources=policyexceptions,verbs=get;list;create;update;delete

const (
	// exceptionResync is how often an exception in force is looked at without a change (its
	// PolicyException is read from the API server: someone's edit is repaired then).
	exceptionResync = 10 * time.Minute
)

// reconciler makes each SecurityIntentException a Kyverno PolicyException and ends it at
// its expiry.
type reconciler struct {
	client    client.Client // the manager's, guarded against reading its own writes stale
	apiReader client.Reader
	recorder  events.EventRecorder
	engines   *cluster.Engines
	reports   *cluster.Reports
	opts      intent.ExceptionRules
	now       func() metav1.Time
	log       logr.Logger
}

// step ends every reconcile of an exception (status.Step).
func (r *reconciler) step() status.Step { return status.Step{Client: r.client, Recorder: r.recorder} }

// exceptionsNaming are the requests of the exceptions naming the intent.
func (r *reconciler) exceptionsNaming(ctx context.Context, intentName string) []reconcile.Request {
	list := &securityv1alpha1.SecurityIntentExceptionList{}
	if err := r.client.List(ctx, list, client.MatchingFields{cluster.IndexExceptionIntent: intentName}, client.UnsafeDisableDeepCopy); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return reqs
}

func (r *reconciler) exceptionsOfBinding(ctx context.Context, obj client.Object) []reconcile.Request {
	var reqs []reconcile.Request
	for _, req := range cluster.IntentsNamed(ctx, obj) {
		reqs = append(reqs, r.exceptionsNaming(ctx, req.Name)...)
	}
	return reqs
}

// reportTargets picks, of a report's targets, the exceptions of the intents it is about.
func (r *reconciler) reportTargets(ctx context.Context, _, _ []client.ObjectKey, intents []string) []client.ObjectKey {
	var out []client.ObjectKey
	for _, n := range intents {
		for _, req := range r.exceptionsNaming(ctx, n) {
			out = append(out, req.NamespacedName)
		}
	}
	return out
}

// Reconcile brings one exception's PolicyException about, or removes it.
func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	exc := &securityv1alpha1.SecurityIntentException{}
	if err := r.client.Get(ctx, req.NamespacedName, exc); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.removePolicyException(ctx, req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	if !exc.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.removePolicyException(ctx, req.NamespacedName)
	}
	before := exc.DeepCopy()
	o, err := r.exempt(ctx, exc)
	if err != nil {
		o = status.Transient("Error", err.Error(), err)
	}
	return r.step().End(ctx, exc, before, status.Reported{Conditions: &exc.Status.Conditions, ObservedGeneration: &exc.Status.ObservedGeneration}, o)
}

// exempt brings the exception's PolicyException to its spec (or removes it when the exception
// is refused or has nothing to exempt), and says so.
func (r *reconciler) exempt(ctx context.Context, exc *securityv1alpha1.SecurityIntentException) (status.Outcome, error) {
	now := r.now().Time
	if ref := intent.CheckException(exc, r.opts, now); ref != nil {
		return r.refuse(ctx, exc, 0, *ref)
	}
	si := &intentv1alpha1.SecurityIntent{}
	if err := r.client.Get(ctx, client.ObjectKey{Name: exc.Spec.Intent}, si); apierrors.IsNotFound(err) {
		return r.refuse(ctx, exc, 0, intent.Refusal{Reason: "IntentNotFound", Message: fmt.Sprintf("SecurityIntent %s does not exist: nothing is exempted until it does", exc.Spec.Intent)})
	} else if err != nil {
		return status.Outcome{}, err
	}
	id := si.Spec.Intent.ID
	ref, namespaced, clusterWide := intent.CheckExceptionIntent(si.Name, id)
	switch {
	case ref != nil:
		return r.refuse(ctx, exc, 0, *ref)
	case !r.engines.Enabled(intent.Kyverno):
		return r.refuse(ctx, exc, 0, intent.Refusal{Reason: "EngineDisabled", Message: "Kyverno, whose PolicyException carries the exemption, is disabled by the manager's --intents-engines"})
	case !r.engines.Has(intent.Kyverno):
		return status.Progressing("EngineNotInstalled", "Kyverno is not installed: its PolicyException is written once it is", cluster.EngineRecheck), nil
	}
	policies, err := r.exemptedPolicies(ctx, exc, si.Name, id, namespaced, clusterWide)
	if err != nil {
		return status.Outcome{}, err
	}
	until := exc.Spec.Expires.Sub(now)
	if len(policies) == 0 {
		if err := r.withdraw(ctx, exc); err != nil {
			return status.Outcome{}, err
		}
		o := status.Healthy("NothingToExempt", fmt.Sprintf("no binding applies SecurityIntent %s to these workloads' namespaces: nothing to exempt from "+
			"(a PolicyException is written when one does); expires %s", si.Name, exc.Spec.Expires.UTC().Format(time.RFC3339)), 0)
		o.RequeueAfter = until + time.Second
		return o, nil
	}
	want, did, o, err := r.writePolicyException(ctx, exc, policies, min(cluster.ConflictRetry, until+time.Second))
	if err != nil || want == nil {
		return o, err
	}
	return r.exempting(ctx, exc, id, policies, want, did, until), nil
}

// withdraw removes what the exception's PolicyException exempted, and its status says none.
func (r *reconciler) withdraw(ctx context.Context, exc *securityv1alpha1.SecurityIntentException) error {
	exc.Status.PolicyException, exc.Status.Policies, exc.Status.Exempted = "", nil, nil
	return r.removePolicyException(ctx, client.ObjectKeyFromObject(exc))
}

// refuse withdraws the exception's exemption and says why, looking again after retry (0: on a
// change only).
func (r *reconciler) refuse(ctx context.Context, exc *securityv1alpha1.SecurityIntentException, retry time.Duration, ref intent.Refusal) (status.Outcome, error) {
	if err := r.withdraw(ctx, exc); err != nil {
		return status.Outcome{}, err
	}
	return status.WaitsForPerson(ref.Reason, ref.Message, retry), nil
}

// writePolicyException brings the exception's PolicyException about, with an Event when it
// changed, and returns it with what the write did. It returns no PolicyException when it is not
// in force: the outcome (or the error) says why, looked at again after retry.
func (r *reconciler) writePolicyException(ctx context.Context, exc *securityv1alpha1.SecurityIntentException, policies []intent.ScannedPolicy, retry time.Duration) (*unstructured.Unstructured, owned.Outcome, status.Outcome, error) {
	names := make([]string, 0, len(policies))
	for _, p := range policies {
		names = append(names, p.Key)
	}
	want, err := intent.PolicyException(exc, r.opts.Namespace, names)
	if err != nil {
		return nil, owned.Unchanged, status.Outcome{}, err
	}
	key := client.ObjectKeyFromObject(exc).String()
	w := &owned.Writer{Client: r.client, Reader: r.apiReader, APIReader: r.apiReader}
	did, _, err := w.Ensure(ctx, want, owned.Options{Claims: func(current client.Object) bool {
		return current.GetAnnotations()[intent.ExceptionAnnotation] == key
	}})
	var o status.Outcome
	switch {
	case err != nil && owned.Rejected(err):
		// What an earlier version of the exception wrote exempts no longer either.
		o, err = r.refuse(ctx, exc, retry, intent.Refusal{Reason: "Rejected", Message: "Kyverno's PolicyException is refused: " + err.Error()})
		return nil, owned.Unchanged, o, err
	case err != nil:
		return nil, owned.Unchanged, status.Outcome{}, err
	case did == owned.Terminating:
		return nil, owned.Unchanged, status.Progressing("NamespaceTerminating", "the exception namespace "+r.opts.Namespace+" is being deleted", retry), nil
	case did == owned.Taken: // withdraw leaves another's PolicyException alone
		o, err = r.refuse(ctx, exc, retry, intent.Refusal{Reason: "Conflict", Message: fmt.Sprintf("PolicyException %s/%s exists and does not carry this exception; it is left alone",
			want.GetNamespace(), want.GetName())})
		return nil, owned.Unchanged, o, err
	case did != owned.Unchanged:
		r.recorder.Eventf(exc, nil, corev1.EventTypeNormal, "PolicyException"+strings.ToUpper(string(did[:1]))+string(did[1:]), "Exempt",
			"%s Kyverno PolicyException %s/%s exempting from %s", did, want.GetNamespace(), want.GetName(), strings.Join(entriesOf(policies), ", "))
	}
	return want, did, status.Outcome{}, nil
}

// exempting is the status of an exception whose PolicyException pe is in force (did: what its
// write did), until its expiry.
func (r *reconciler) exempting(ctx context.Context, exc *securityv1alpha1.SecurityIntentException, id string, policies []intent.ScannedPolicy,
	pe *unstructured.Unstructured, did owned.Outcome, until time.Duration) status.Outcome {
	st := &exc.Status
	st.PolicyException = pe.GetNamespace() + "/" + pe.GetName()
	st.Policies = entriesOf(policies)
	exempted, readable, err := r.exempted(ctx, policies, pe.GetName())
	seen := "Kyverno's reports cannot be read (see the intent's impact)"
	if err != nil {
		// Not the exception's failure: its status, and its requeue at expiry, are written anyway.
		readable, seen = false, "Kyverno's reports could not be read: "+err.Error()
	}
	st.Exempted = nil
	if readable {
		st.Exempted = ptr.To(exempted)
		seen = fmt.Sprintf("Kyverno's reports show %d workloads skipped under it", exempted)
	}
	msg := fmt.Sprintf("Kyverno's PolicyException %s exempts the workloads from %s until %s (owner %s); %s",
		st.PolicyException, strings.Join(st.Policies, ", "), exc.Spec.Expires.UTC().Format(time.RFC3339), exc.Spec.Owner, seen)
	if others := r.unexempted(id); others != "" {
		msg += "; " + others
	}
	var o status.Outcome
	if until <= r.opts.Warning {
		o = status.Healthy("ExpiresSoon", "expires in "+until.Round(time.Minute).String()+": "+msg, 0)
		o.EventType = corev1.EventTypeWarning
		o.RequeueAfter = min(until+time.Second, exceptionResync)
	} else {
		o = status.Healthy("Exempting", msg, 0)
		o.RequeueAfter = min(until-r.opts.Warning+time.Second, exceptionResync)
	}
	if did != owned.Unchanged && o.Reason == "Exempting" {
		o = o.Silenced() // the write's Event said it
	}
	return o
}

// unexempted says which of the intent's other engines still enforce it on the exempted workloads
// ("" when none): KubeArmor, which enforces escapeToHost at run time too, has no exception.
func (r *reconciler) unexempted(id string) string {
	var still []intent.Engine
	for _, e := range slices.Concat(intent.Implementations[id], intent.ClusterImplementations[id]) {
		if e != intent.Kyverno && !slices.Contains(still, e) && r.engines.Enabled(e) && r.engines.Has(e) {
			still = append(still, e)
		}
	}
	if len(still) == 0 {
		return ""
	}
	return intent.JoinEngines(still) + " still enforces " + id + " on them at run time (no exception of its own; leave them out of the bindings' selectors where they must be exempt from it too)"
}

// exemptedPolicies are the intent's Kyverno policies that apply to the exception's namespaces:
// the namespaced Policy of each SecurityIntentBinding naming it there, the ClusterPolicy of each
// ClusterSecurityIntentBinding naming it, by their key in Kyverno's results, sorted.
func (r *reconciler) exemptedPolicies(ctx context.Context, exc *securityv1alpha1.SecurityIntentException, intentName, id string, namespaced, clusterWide bool) ([]intent.ScannedPolicy, error) {
	sibs, csibs, err := cluster.BindingsNaming(ctx, r.client, intentName)
	if err != nil {
		return nil, err
	}
	namespaces := intent.ExemptedNamespaces(exc)
	var out []intent.ScannedPolicy
	for _, sib := range sibs {
		if namespaced && (slices.Contains(namespaces, "*") || slices.Contains(namespaces, sib.Namespace)) {
			p, _, _ := intent.KyvernoPolicyOf(sib.Namespace, intent.PolicyName(sib.Name, id))
			out = append(out, intent.ScannedPolicy{Key: p.Key, Entry: "KyvernoPolicy/" + p.Key}) // namespaced: the exception may span namespaces
		}
	}
	for _, csib := range csibs {
		if !clusterWide {
			break
		}
		p, _, _ := intent.KyvernoPolicyOf("", intent.PolicyName(csib.Name, id))
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b intent.ScannedPolicy) int { return strings.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b intent.ScannedPolicy) bool { return a.Key == b.Key }), nil
}

func entriesOf(policies []intent.ScannedPolicy) []string {
	out := make([]string, 0, len(policies))
	for _, p := range policies {
		out = append(out, p.Entry)
	}
	return out
}

// removePolicyException deletes the PolicyException carrying the exception key, when there is
// one and it carries that exception.
func (r *reconciler) removePolicyException(ctx context.Context, key client.ObjectKey) error {
	if r.opts.Namespace == "" {
		return nil // none is written (the sweep removes those of an earlier configuration)
	}
	pe := &unstructured.Unstructured{}
	pe.SetGroupVersionKind(intent.PolicyExceptionKind)
	err := r.apiReader.Get(ctx, client.ObjectKey{Namespace: r.opts.Namespace, Name: intent.PolicyExceptionName(key.Namespace, key.Name)}, pe)
	if notServed(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pe.GetAnnotations()[intent.ExceptionAnnotation] != key.String() {
		return nil // someone else's: left alone (the exception's status said Conflict)
	}
	return client.IgnoreNotFound(r.client.Delete(ctx, pe, client.Preconditions{UID: new(pe.GetUID())}))
}

// notServed reports an error that says there is no such object, or no such kind (Kyverno not
// installed): there is no PolicyException to remove then.
func notServed(err error) bool {
	return apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

// exempted counts the workloads Kyverno's reports say it skipped, for any of the policies, under
// the PolicyException named pe; readable is false while the reports cannot be read.
func (r *reconciler) exempted(ctx context.Context, policies []intent.ScannedPolicy, pe string) (int32, bool, error) {
	if !r.reports.Current().Readable {
		return 0, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cluster.ReadTimeout)
	defer cancel()
	n, err := intent.Exempted(policies, pe, r.reports.ReportsOf(ctx))
	return n, err == nil, err
}

// sweep deletes, once each time the controller leads, the PolicyExceptions it wrote that
// carry nothing any more: those of exceptions deleted while no manager ran (a running one deletes
// them at once), and every one outside --intents-exception-namespace (all of them when exceptions
// are off: a manager restarted with the flag changed or empty leaves no exemption in force).
type sweep struct {
	*reconciler
}

func (s sweep) NeedLeaderElection() bool { return true }

func (s sweep) Start(ctx context.Context) error {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(intent.PolicyExceptionKind.GroupVersion().WithKind("PolicyExceptionList"))
	if err := s.apiReader.List(ctx, list, client.MatchingLabels{intent.ManagedByLabel: intent.ManagedByValue}); err != nil {
		if notServed(err) {
			return nil // Kyverno is not installed: nothing was written
		}
		s.log.Error(err, "the PolicyExceptions of SecurityIntentExceptions could not be listed: those left behind are not swept until the next start")
		return nil
	}
	for i := range list.Items {
		pe := &list.Items[i]
		nsName := pe.GetAnnotations()[intent.ExceptionAnnotation]
		if pe.GetNamespace() == s.opts.Namespace {
			ns, name, ok := strings.Cut(nsName, "/")
			if !ok {
				continue
			}
			exc := &securityv1alpha1.SecurityIntentException{}
			err := s.apiReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, exc)
			if !apierrors.IsNotFound(err) {
				continue // it exists (its reconcile keeps or removes its PolicyException), or cannot be read now
			}
		}
		err := s.client.Delete(ctx, pe, client.Preconditions{UID: new(pe.GetUID())})
		if client.IgnoreNotFound(err) != nil {
			s.log.Error(err, "a PolicyException no SecurityIntentException carries could not be deleted", "policyException", client.ObjectKeyFromObject(pe), "exception", nsName)
			continue
		}
		s.log.Info("deleted a PolicyException no SecurityIntentException carries", "policyException", client.ObjectKeyFromObject(pe), "exception", nsName)
	}
	return nil
}

// State is the state quartermaster_objects counts an exception in: expiring (Ready, in
// its last --intents-exception-expiry-warning) and expired beside ready, stalled and reconciling.
func State(obj client.Object) string {
	switch status.ReadyReason(status.ConditionsOf(obj)) {
	case "ExpiresSoon":
		return "expiring"
	case "Expired":
		return "expired"
	}
	return status.ConditionState(obj)
}

// Setup registers the exceptions part: its controller (one queue, opts) and its sweep. engines and
// reports are what it knows of the cluster; rules are the platform's (the manager's flags).
func Setup(mgr ctrl.Manager, opts controller.Options, engines *cluster.Engines, reports *cluster.Reports, rules intent.ExceptionRules) error {
	status.CountObjects(mgr, "SecurityIntentException", &securityv1alpha1.SecurityIntentExceptionList{}, State)
	r := &reconciler{
		client:    status.NewClient(owned.WithFieldOwner(mgr.GetClient()), &securityv1alpha1.SecurityIntentException{}),
		apiReader: mgr.GetAPIReader(), recorder: status.NewRecorder(mgr, "quartermaster-intents"),
		engines: engines, reports: reports, opts: rules, now: metav1.Now, log: mgr.GetLogger().WithName("intents").WithName("exceptions"),
	}
	b := builder.ControllerManagedBy(mgr)
	for _, src := range reports.Sources(cluster.Scanned(mgr.GetClient(), &securityv1alpha1.SecurityIntentExceptionList{}, cluster.IndexExceptionIntent), r.reportTargets) {
		b = b.WatchesRawSource(src)
	}
	if engines.Enabled(intent.Kyverno) {
		// Kyverno installed after the start: what waited for it (EngineNotInstalled) is written now.
		b = b.WatchesRawSource(engines.Kinds().WhenMet(engines.Need(intent.Kyverno),
			cluster.EnqueueAll(mgr.GetClient(), &securityv1alpha1.SecurityIntentExceptionList{}, r.log)).Prepare(engines.Prepare(intent.Kyverno)))
	}
	// The intent's id and its bindings say which policies are exempted from.
	changed := builder.WithPredicates(predicate.GenerationChangedPredicate{})
	err := b.Named("securityintentexception").
		For(&securityv1alpha1.SecurityIntentException{}, changed).
		Watches(&intentv1alpha1.SecurityIntent{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return r.exceptionsNaming(ctx, o.GetName())
		}), changed).
		Watches(&intentv1alpha1.SecurityIntentBinding{}, handler.EnqueueRequestsFromMapFunc(r.exceptionsOfBinding), changed).
		Watches(&intentv1alpha1.ClusterSecurityIntentBinding{}, handler.EnqueueRequestsFromMapFunc(r.exceptionsOfBinding), changed).
		WithOptions(opts).
		Complete(r)
	if err != nil {
		return err
	}
	return mgr.Add(sweep{r})
}
