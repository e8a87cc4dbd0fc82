package mirrors

import (
	"context"
	"fmt"
	"reflect"
	"sync"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// observed is what the applied objects show after the apply.
type observed struct {
	endpoint string
	cache    *appsv1.StatefulSet
	agent    *appsv1.DaemonSet
}

// applier creates and updates one mirror's objects.
type applier struct {
	r     *Reconciler
	owner *registryv1alpha1.RegistryMirror

	mu    sync.Mutex
	taken string // an object of ours has a name someone else's object holds
}

// applyAll brings every object of the mirror to its desired state, independent ones at once:
// the DaemonSet waits for the Service's address, which it hands to the agents.
func (a *applier) applyAll(ctx context.Context, spec mirror.Spec, secret *corev1.Secret) (observed, error) {
	in := a.r.install
	var st observed
	// Hashed before the writes start: the Secret's create decodes the answer into secret.
	hash := mirror.ConfigHash(secret.Data)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { _, err := a.apply(ctx, secret); return err })
	g.Go(func() error { _, err := a.apply(ctx, mirror.HeadlessService(in, spec)); return err })
	g.Go(func() error { _, err := a.apply(ctx, mirror.PodDisruptionBudget(in, spec)); return err })
	g.Go(func() error {
		sts, err := a.apply(ctx, mirror.StatefulSet(in, spec, hash))
		if sts != nil {
			st.cache = sts.(*appsv1.StatefulSet)
		}
		return err
	})
	g.Go(func() error {
		svc, err := a.apply(ctx, mirror.Service(in, spec))
		if err != nil || svc == nil {
			return err
		}
		st.endpoint = mirror.Endpoint(svc.(*corev1.Service))
		if st.endpoint == "" {
			return nil
		}
		ds, err := a.apply(ctx, mirror.AgentDaemonSet(in, spec, st.endpoint))
		if ds != nil {
			st.agent = ds.(*appsv1.DaemonSet)
		}
		return err
	})
	if err := g.Wait(); err != nil {
		return observed{}, err
	}
	if st.cache == nil || st.agent == nil {
		st.endpoint = "" // some object is not ours yet (a.taken says which), or has no address
	}
	return st, nil
}

// apply creates desired, or updates the object in place when it differs from desired in what
// the controller sets; it returns the object as the API server (or the cache) has it, or nil when
// the name is taken by an object the mirror does not own.
func (a *applier) apply(ctx context.Context, desired client.Object) (client.Object, error) {
	if err := controllerutil.SetControllerReference(a.owner, desired, a.r.scheme); err != nil {
		return nil, err
	}
	current := reflect.New(reflect.TypeOf(desired).Elem()).Interface().(client.Object)
	err := a.r.objects.Get(ctx, client.ObjectKeyFromObject(desired), current)
	if apierrors.IsNotFound(err) {
		err = a.r.objects.Create(ctx, desired)
		if apierrors.IsAlreadyExists(err) {
			return nil, a.existing(ctx, desired)
		}
		if err != nil {
			return nil, fmt.Errorf("creating %s %s: %w", kindOf(desired), desired.GetName(), err)
		}
		return desired, nil
	}
	if err != nil {
		return nil, err
	}
	if !ownedBy(current, a.owner) {
		a.nameTaken(current)
		return nil, nil
	}
	if matches(desired, current) {
		return current, nil
	}
	keepImmutable(desired, current)
	desired.SetResourceVersion(current.GetResourceVersion())
	if err := a.r.objects.Update(ctx, desired); err != nil {
		return nil, fmt.Errorf("updating %s %s: %w", kindOf(desired), desired.GetName(), err)
	}
	return desired, nil
}

// existing handles a create refused because the name exists though the cache does not show it:
// either the cache is behind our own create (the object's watch event brings the next reconcile)
// or the object is someone else's.
func (a *applier) existing(ctx context.Context, desired client.Object) error {
	live := reflect.New(reflect.TypeOf(desired).Elem()).Interface().(client.Object)
	if err := a.r.apiReader.Get(ctx, client.ObjectKeyFromObject(desired), live); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !ownedBy(live, a.owner) {
		a.nameTaken(live)
		return nil
	}
	return fmt.Errorf("%s %s exists but the cache has not caught up with it yet", kindOf(desired), desired.GetName())
}

func (a *applier) nameTaken(obj client.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.taken = fmt.Sprintf("%s %s/%s exists and does not belong to this mirror: delete or rename it", kindOf(obj), obj.GetNamespace(), obj.GetName())
}

func ownedBy(obj client.Object, owner client.Object) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == owner.GetUID()
}

func kindOf(obj client.Object) string {
	return reflect.TypeOf(obj).Elem().Name()
}

// matches reports whether current already has everything desired sets: fields desired leaves
// unset are the API server's defaults (or another controller's, like the Service's cluster IP)
// and do not count.
func matches(desired, current client.Object) bool {
	if !equality.Semantic.DeepDerivative(desired.GetLabels(), current.GetLabels()) ||
		!equality.Semantic.DeepDerivative(desired.GetOwnerReferences(), current.GetOwnerReferences()) {
		return false
	}
	switch d := desired.(type) {
	case *corev1.Secret:
		c := current.(*corev1.Secret)
		return d.Type == c.Type && equality.Semantic.DeepEqual(d.Data, c.Data)
	case *corev1.Service:
		c := current.(*corev1.Service)
		return equality.Semantic.DeepDerivative(withNodePorts(d, c).Spec, c.Spec)
	case *appsv1.StatefulSet:
		return equality.Semantic.DeepDerivative(d.Spec, current.(*appsv1.StatefulSet).Spec)
	case *appsv1.DaemonSet:
		return equality.Semantic.DeepDerivative(d.Spec, current.(*appsv1.DaemonSet).Spec)
	case *policyv1.PodDisruptionBudget:
		return equality.Semantic.DeepDerivative(d.Spec, current.(*policyv1.PodDisruptionBudget).Spec)
	}
	return false
}

// withNodePorts gives desired's ports the node ports the API server allocated for current, so an
// allocated port is neither a difference nor lost by an update.
func withNodePorts(desired, current *corev1.Service) *corev1.Service {
	if desired.Spec.Type != corev1.ServiceTypeNodePort || current.Spec.Type != corev1.ServiceTypeNodePort {
		return desired
	}
	for i, p := range desired.Spec.Ports {
		for _, cp := range current.Spec.Ports {
			if cp.Name == p.Name && p.NodePort == 0 {
				desired.Spec.Ports[i].NodePort = cp.NodePort
			}
		}
	}
	return desired
}

// keepImmutable copies into desired the fields of current that an update may not change.
func keepImmutable(desired, current client.Object) {
	switch d := desired.(type) {
	case *corev1.Service:
		c := current.(*corev1.Service)
		d.Spec.ClusterIP, d.Spec.ClusterIPs = c.Spec.ClusterIP, c.Spec.ClusterIPs
		d.Spec.IPFamilies, d.Spec.IPFamilyPolicy = c.Spec.IPFamilies, c.Spec.IPFamilyPolicy
		withNodePorts(d, c)
	case *appsv1.StatefulSet:
		// spec.storage is immutable at admission; the templates as stored (with the server's
		// defaults) are kept so the update is accepted.
		c := current.(*appsv1.StatefulSet)
		d.Spec.VolumeClaimTemplates = c.Spec.VolumeClaimTemplates
		d.Spec.Selector, d.Spec.ServiceName, d.Spec.PodManagementPolicy = c.Spec.Selector, c.Spec.ServiceName, c.Spec.PodManagementPolicy
	case *appsv1.DaemonSet:
		d.Spec.Selector = current.(*appsv1.DaemonSet).Spec.Selector
	}
}
