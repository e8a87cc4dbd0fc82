package intents

import (
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
)

// The exceptions as their intent's status shows them (status.exceptions).

// exceptionShown passes the changes of an exception that its intent's status shows.
func exceptionShown() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			a, ok1 := e.ObjectOld.(*securityv1alpha1.SecurityIntentException)
			b, ok2 := e.ObjectNew.(*securityv1alpha1.SecurityIntentException)
			if !ok1 || !ok2 {
				return true
			}
			return a.Spec.Intent != b.Spec.Intent || !equality.Semantic.DeepEqual(summarize(a), summarize(b))
		},
	}
}

// summarize is how an intent's status shows the exception.
func summarize(exc *securityv1alpha1.SecurityIntentException) intentv1alpha1.IntentException {
	return intentv1alpha1.IntentException{
		Name: exc.Namespace + "/" + exc.Name, Owner: exc.Spec.Owner, Expires: exc.Spec.Expires,
		State: status.ReadyReason(exc.Status.Conditions), Exempted: exc.Status.Exempted,
	}
}

// exceptionsOf maps an exception to the intent it names.
func exceptionsOf(_ context.Context, obj client.Object) []reconcile.Request {
	exc, ok := obj.(*securityv1alpha1.SecurityIntentException)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: exc.Spec.Intent}}}
}

// intentExceptions are the exceptions naming the intent, as its status lists them (the first
// MaxListedExceptions by namespace/name).
func (b *base) intentExceptions(ctx context.Context, name string) ([]intentv1alpha1.IntentException, error) {
	list := &securityv1alpha1.SecurityIntentExceptionList{}
	if err := b.client.List(ctx, list, client.MatchingFields{cluster.IndexExceptionIntent: name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := make([]intentv1alpha1.IntentException, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, summarize(&list.Items[i]))
	}
	slices.SortFunc(out, func(a, b intentv1alpha1.IntentException) int { return strings.Compare(a.Name, b.Name) })
	if len(out) == 0 {
		return nil, nil
	}
	return out[:min(len(out), intentv1alpha1.MaxListedExceptions)], nil
}
