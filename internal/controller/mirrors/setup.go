package mirrors

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/util/workqueue"
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

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// +kubebuilder:rbac:groups=registry.quartermaster.dev,resources=registrymirrors,verbs=get;list;watch
// +kubebuilder:rbac:groups=registry.quartermaster.dev,resources=registrymirrors/status,verbs=get;patch
// The mirror's objects are owned with blockOwnerDeletion, which needs update on its finalizers.
// +kubebuilder:rbac:groups=registry.quartermaster.dev,resources=registrymirrors/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// Everything a mirror is made of lives in the operator's namespace; if --mirrors-namespace names
// another one, move this Role there.
// The garbage collector deletes a mirror's objects; the controller deletes only the node agent of a
// mirror refused for its host.
// +kubebuilder:rbac:groups="",namespace=quartermaster-mirrors,resources=secrets;services,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=apps,namespace=quartermaster-mirrors,resources=statefulsets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=apps,namespace=quartermaster-mirrors,resources=daemonsets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=policy,namespace=quartermaster-mirrors,resources=poddisruptionbudgets,verbs=get;list;watch;create;update
// The cache pods are read for why they fail (their containers' termination messages) and for their
// notes of the pins, and annotated so that their kubelets hand them new pins at once (the
// quartermaster-manager-pods admission policy allows no other change).
// +kubebuilder:rbac:groups="",namespace=quartermaster-mirrors,resources=pods,verbs=get;list;watch;patch

// Field indexes of the shared cache.
const (
	indexMirrorHost  = "status.effectiveMirrorHost"
	indexCredentials = "spec.credentialsSecret"
)

// Setup registers the mirrors controller with the manager.
func Setup(mgr ctrl.Manager, o Options) error {
	_, err := setup(mgr, o)
	return err
}

func setup(mgr ctrl.Manager, o Options) (*Reconciler, error) {
	if _, _, err := mgr.GetScheme().ObjectKinds(&registryv1alpha1.RegistryMirror{}); err != nil {
		return nil, errors.New("the manager's scheme lacks registry.quartermaster.dev/v1alpha1 (add registryv1alpha1.AddToScheme)")
	}
	objects, err := newObjectCache(mgr, o.Namespace)
	if err != nil {
		return nil, err
	}
	status.CountObjects(mgr, "RegistryMirror", &registryv1alpha1.RegistryMirrorList{}, status.ConditionState)
	// Writes go through the manager's client; reads of the mirror's own objects come from the
	// controller's cache, guarded against returning an object older than our last write of it.
	objectClient, err := client.New(mgr.GetConfig(), client.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		Cache: &client.CacheOptions{Reader: objects},
	})
	if err != nil {
		return nil, err
	}
	r := &Reconciler{
		client: status.NewClient(mgr.GetClient(), &registryv1alpha1.RegistryMirror{}),
		objects: status.NewClient(owned.WithFieldOwner(objectClient),
			&corev1.Secret{}, &corev1.ConfigMap{}, &corev1.Service{}, &appsv1.StatefulSet{}, &appsv1.DaemonSet{}, &policyv1.PodDisruptionBudget{}, &corev1.Pod{}),
		apiReader: mgr.GetAPIReader(),
		scheme:    mgr.GetScheme(),
		recorder:  status.NewRecorder(mgr, "quartermaster-mirrors"),
		install: mirror.Install{Namespace: o.Namespace, Image: o.Image, AgentServiceAccount: o.AgentServiceAccount,
			CacheServiceAccount: o.CacheServiceAccount, PrepareStorage: o.PrepareStorage},
		resync:    o.Resync,
		slowRetry: time.Minute,
		now:       time.Now,
	}
	if o.PinByUse {
		if r.usage, err = newUsageCache(mgr); err != nil {
			return nil, err
		}
	}
	if o.CheckUpstream {
		r.upstream = newUpstreamChecker(o.Resync)
	}
	if err := index(mgr); err != nil {
		return nil, err
	}
	owned := func(obj client.Object) source.Source {
		return source.Kind(objects, obj, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(),
			&registryv1alpha1.RegistryMirror{}, handler.OnlyControllerOwner()))
	}
	b := builder.ControllerManagedBy(mgr)
	if r.usage != nil {
		for _, src := range r.usageSources() {
			b = b.WatchesRawSource(src)
		}
	}
	err = b.
		Named("registrymirror").
		// Only spec changes and deletion: the controller's own status writes trigger nothing.
		For(&registryv1alpha1.RegistryMirror{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A mirror created, deleted or moved to another host wakes the others of the same host
		// (one of them may now be the one that serves it).
		Watches(&registryv1alpha1.RegistryMirror{}, handler.EnqueueRequestsFromMapFunc(r.sameHost),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(owned(&appsv1.StatefulSet{})).
		WatchesRawSource(owned(&appsv1.DaemonSet{})).
		WatchesRawSource(owned(&corev1.Service{})).
		WatchesRawSource(owned(&policyv1.PodDisruptionBudget{})).
		WatchesRawSource(owned(&corev1.ConfigMap{})).
		// Cache pods: a container's failure or its end, a pod's readiness and its note of the pins
		// change what the mirror reports.
		WatchesRawSource(source.Kind(objects, client.Object(&corev1.Pod{}), handler.EnqueueRequestsFromMapFunc(mirrorOfPod),
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				was, is := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
				return mirror.CacheFailure(was) != mirror.CacheFailure(is) ||
					was.Annotations[mirror.AnnotationCacheReport] != is.Annotations[mirror.AnnotationCacheReport] ||
					podReady(was) != podReady(is)
			}})).
		// Secrets: the cache's own (owned), and the users' credentials Secrets they name.
		WatchesRawSource(source.Kind(objects, client.Object(&corev1.Secret{}), handler.EnqueueRequestsFromMapFunc(r.secretUsers))).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: o.Concurrency,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, 2*time.Minute),
		}).
		Complete(r)
	return r, err
}

// newObjectCache is the controller's own cache of the mirrors' namespace: the objects it made
// (by label), and every Secret there (the users' credentials Secrets carry no label of ours).
func newObjectCache(mgr ctrl.Manager, namespace string) (cache.Cache, error) {
	ours, err := labels.NewRequirement(mirror.LabelMirror, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	byLabel := cache.ByObject{Label: labels.NewSelector().Add(*ours)}
	cachePods, err := labels.NewRequirement(mirror.LabelComponent, selection.Equals, []string{mirror.ComponentCache})
	if err != nil {
		return nil, err
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
		DefaultTransform:  cachemeta.Transform,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Service{}:               byLabel,
			&appsv1.StatefulSet{}:           byLabel,
			&appsv1.DaemonSet{}:             byLabel,
			&policyv1.PodDisruptionBudget{}: byLabel,
			&corev1.ConfigMap{}:             byLabel,
			&corev1.Pod{}:                   {Label: labels.NewSelector().Add(*ours, *cachePods)},
		},
	})
	if err != nil {
		return nil, err
	}
	return c, controllers.AddCache(mgr, c)
}

func index(mgr ctrl.Manager) error {
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &registryv1alpha1.RegistryMirror{}, indexMirrorHost, func(o client.Object) []string {
		s, err := mirror.Resolve(o.(*registryv1alpha1.RegistryMirror))
		if err != nil {
			return nil
		}
		return []string{s.MirrorHost}
	}); err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &registryv1alpha1.RegistryMirror{}, indexCredentials, func(o client.Object) []string {
		if name := o.(*registryv1alpha1.RegistryMirror).Spec.CredentialsSecret; name != "" {
			return []string{name}
		}
		return nil
	})
}

// sameHost maps a mirror to the other mirrors of its host.
func (r *Reconciler) sameHost(ctx context.Context, obj client.Object) []reconcile.Request {
	s, err := mirror.Resolve(obj.(*registryv1alpha1.RegistryMirror))
	if err != nil {
		return nil
	}
	list := &registryv1alpha1.RegistryMirrorList{}
	if err := r.client.List(ctx, list, client.MatchingFields{indexMirrorHost: s.MirrorHost}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, rm := range list.Items {
		if rm.Name != obj.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: rm.Name}})
		}
	}
	return out
}

// mirrorOfPod maps a cache pod to its mirror.
func mirrorOfPod(_ context.Context, obj client.Object) []reconcile.Request {
	if name, ok := obj.GetLabels()[mirror.LabelMirror]; ok {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: name}}}
	}
	return nil
}

// secretUsers maps a Secret to the mirror that owns it (the cache Secret) or to the mirrors whose
// credentialsSecret it is.
func (r *Reconciler) secretUsers(ctx context.Context, obj client.Object) []reconcile.Request {
	var out []reconcile.Request
	if name, ok := obj.GetLabels()[mirror.LabelMirror]; ok {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
	}
	list := &registryv1alpha1.RegistryMirrorList{}
	if err := r.client.List(ctx, list, client.MatchingFields{indexCredentials: obj.GetName()}); err != nil {
		return out
	}
	for _, rm := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: rm.Name}})
	}
	return out
}
