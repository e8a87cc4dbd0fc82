package cluster

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
)

// The indexes of the manager's cache the parts share, registered once (Index), and the lookups
// through them.

// IndexIntents indexes bindings by the SecurityIntent names they list.
const IndexIntents = "spec.intents.name"

// IndexExceptionIntent indexes SecurityIntentExceptions by the intent they name.
const IndexExceptionIntent = "spec.intent"

// Index registers the shared indexes with the manager's cache, before it starts: bindings by the
// intents they name, exceptions by their intent, NimbusPolicies by their controller.
func Index(mgr ctrl.Manager) error {
	ctx := context.Background()
	names := func(intents []intentv1alpha1.MatchIntent) []string {
		out := make([]string, 0, len(intents))
		for _, m := range intents {
			out = append(out, m.Name)
		}
		return out
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &intentv1alpha1.SecurityIntentBinding{}, IndexIntents, func(o client.Object) []string {
		return names(o.(*intentv1alpha1.SecurityIntentBinding).Spec.Intents)
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &intentv1alpha1.ClusterSecurityIntentBinding{}, IndexIntents, func(o client.Object) []string {
		return names(o.(*intentv1alpha1.ClusterSecurityIntentBinding).Spec.Intents)
	}); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &securityv1alpha1.SecurityIntentException{}, IndexExceptionIntent, func(o client.Object) []string {
		return []string{o.(*securityv1alpha1.SecurityIntentException).Spec.Intent}
	}); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &intentv1alpha1.NimbusPolicy{}, IndexController, ControllerUID)
}

// IntentsNamed maps a binding to the SecurityIntents it names.
func IntentsNamed(_ context.Context, obj client.Object) []reconcile.Request {
	var names []intentv1alpha1.MatchIntent
	switch b := obj.(type) {
	case *intentv1alpha1.SecurityIntentBinding:
		names = b.Spec.Intents
	case *intentv1alpha1.ClusterSecurityIntentBinding:
		names = b.Spec.Intents
	}
	reqs := make([]reconcile.Request, 0, len(names))
	for _, m := range names {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Name: m.Name}})
	}
	return reqs
}

// BindingsNaming lists the bindings of both kinds that name the intent, from the cache. The
// cache's objects are not copied (an intent may be bound thousands of times): callers only read
// them.
func BindingsNaming(ctx context.Context, c client.Reader, name string) ([]intentv1alpha1.SecurityIntentBinding, []intentv1alpha1.ClusterSecurityIntentBinding, error) {
	sibs := &intentv1alpha1.SecurityIntentBindingList{}
	if err := c.List(ctx, sibs, client.MatchingFields{IndexIntents: name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	csibs := &intentv1alpha1.ClusterSecurityIntentBindingList{}
	if err := c.List(ctx, csibs, client.MatchingFields{IndexIntents: name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, err
	}
	return sibs.Items, csibs.Items, nil
}
