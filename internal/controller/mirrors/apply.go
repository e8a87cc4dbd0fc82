package mirrors

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/drift"
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

	mu      sync.Mutex
	taken   string   // an object of ours has a name someone else's object holds
	changed []string // what the apply created or updated, for the Event
}

// applyAll brings every object of the mirror to its desired state, independent ones at once:
// the DaemonSet waits for the Service's address, which it hands to the agents.
func (a *applier) applyAll(ctx context.Context, spec mirror.Spec, secret *corev1.Secret, pins *corev1.ConfigMap) (observed, error) {
	in := a.r.install
	var st observed
	// Hashed before the writes start: the Secret's create decodes the answer into secret.
	hash := mirror.ConfigHash(secret.Data)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { _, err := a.apply(ctx, secret); return err })
	g.Go(func() error { _, err := a.apply(ctx, pins); return err })
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

// apply brings one of the mirror's objects to desired (owned.Writer: the one create-or-update path
// of generated objects); it returns the object as the API server (or the cache) has it, or nil when
// the name is taken by an object the mirror does not own.
func (a *applier) apply(ctx context.Context, desired client.Object) (client.Object, error) {
	if err := controllerutil.SetControllerReference(a.owner, desired, a.r.scheme); err != nil {
		return nil, err
	}
	w := owned.Writer{Client: a.r.objects, Reader: a.r.objects, APIReader: a.r.apiReader}
	did, obj, err := w.Ensure(ctx, desired, owned.Options{Others: othersMayWrite, Prepare: prepareUpdate})
	if err != nil {
		return nil, fmt.Errorf("applying %s %s: %w", owned.Kind(desired), desired.GetName(), err)
	}
	switch did {
	case owned.Taken:
		a.nameTaken(desired)
		return nil, nil
	case owned.Created, owned.Updated, owned.Reverted:
		a.record(string(did), desired)
	}
	return obj, nil
}

// othersMayWrite: a pod template's annotations are kubectl rollout restart's to set (it restarts
// the pods; an update of ours keeps them, prepareUpdate).
var othersMayWrite = []drift.Path{"spec.template.metadata.annotations"}

func (a *applier) record(verb string, obj client.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.changed = append(a.changed, verb+" "+owned.Kind(obj)+" "+obj.GetName())
}

// prepareUpdate carries into an update what it may not change or must not undo: the fields an update
// may not change (keepImmutable), and the pod template annotations others set.
func prepareUpdate(desired, current client.Object) {
	keepImmutable(desired, current)
	switch d := desired.(type) {
	case *appsv1.StatefulSet:
		c := current.(*appsv1.StatefulSet)
		d.Spec.Template.Annotations = owned.Merged(c.Spec.Template.Annotations, d.Spec.Template.Annotations)
	case *appsv1.DaemonSet:
		c := current.(*appsv1.DaemonSet)
		d.Spec.Template.Annotations = owned.Merged(c.Spec.Template.Annotations, d.Spec.Template.Annotations)
	}
}

func (a *applier) nameTaken(obj client.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.taken = fmt.Sprintf("%s %s/%s exists and does not belong to this mirror: delete or rename it", owned.Kind(obj), obj.GetNamespace(), obj.GetName())
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
