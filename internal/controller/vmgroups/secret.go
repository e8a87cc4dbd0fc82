package vmgroups

import (
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
)

// newSecretCache makes a cache of the one vCenter Secret, apart from the manager's cache: it needs
// list and watch on Secrets only in the Secret's namespace and holds no other Secret, so a resync
// reads no Secret from the API server and a rotation is seen at once.
func newSecretCache(mgr ctrl.Manager, ref types.NamespacedName) (cache.Cache, error) {
	return cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient:        mgr.GetHTTPClient(),
		Scheme:            mgr.GetScheme(),
		Mapper:            mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{ref.Namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Field: fields.OneTermEqualSelector("metadata.name", ref.Name)},
		},
		DefaultTransform: cachemeta.Transform,
	})
}

// secretSource reconciles every VmGroup when the vCenter Secret appears, goes, or its data
// changes: they all use it.
func (r *Reconciler) secretSource() source.Source {
	dataChanged := predicate.TypedFuncs[*corev1.Secret]{UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Secret]) bool {
		return !maps.EqualFunc(e.ObjectOld.Data, e.ObjectNew.Data, slices.Equal)
	}}
	return source.Kind(r.secrets, &corev1.Secret{}, handler.TypedEnqueueRequestsFromMapFunc(r.everyGroup), dataChanged)
}

func (r *Reconciler) everyGroup(ctx context.Context, _ *corev1.Secret) []reconcile.Request {
	list := &computev1alpha1.VmGroupList{}
	if err := r.Client.List(ctx, list); err != nil {
		// The manager's cache failing to list is not expected; the resyncs still come.
		logf.FromContext(ctx).Error(err, "listing VmGroups after a change of the vCenter Secret")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, vg := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&vg)})
	}
	return reqs
}
