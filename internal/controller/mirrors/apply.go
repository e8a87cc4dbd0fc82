package mirrors

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"sync"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

	mu      sync.Mutex
	taken   string   // an object of ours has a name someone else's object holds
	changed []string // what the apply created or updated, for the Event
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
	hash, err := specHash(desired)
	if err != nil {
		return nil, err
	}
	desired.SetAnnotations(merged(desired.GetAnnotations(), map[string]string{annotationSpecHash: hash}))
	current := reflect.New(reflect.TypeOf(desired).Elem()).Interface().(client.Object)
	err = a.r.objects.Get(ctx, client.ObjectKeyFromObject(desired), current)
	if apierrors.IsNotFound(err) {
		err = a.r.objects.Create(ctx, desired)
		switch {
		case err == nil:
			a.record("created", desired)
			return desired, nil
		case !apierrors.IsAlreadyExists(err):
			return nil, fmt.Errorf("creating %s %s: %w", kindOf(desired), desired.GetName(), err)
		}
		// The name exists though the cache does not show it: the cache is behind (our own
		// create of a moment ago, say), or the object is someone else's. Ask the API server.
		err = a.r.apiReader.Get(ctx, client.ObjectKeyFromObject(desired), current)
	}
	if err != nil {
		return nil, err
	}
	if !ownedBy(current, a.owner) {
		a.nameTaken(current)
		return nil, nil
	}
	if current.GetAnnotations()[annotationSpecHash] == hash && matches(desired, current) {
		return current, nil
	}
	keepImmutable(desired, current)
	keepOthers(desired, current)
	desired.SetResourceVersion(current.GetResourceVersion())
	if err := a.r.objects.Update(ctx, desired); err != nil {
		return nil, fmt.Errorf("updating %s %s: %w", kindOf(desired), desired.GetName(), err)
	}
	a.record("updated", desired)
	return desired, nil
}

func (a *applier) record(verb string, obj client.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.changed = append(a.changed, verb+" "+kindOf(obj)+" "+obj.GetName())
}

// annotationSpecHash on each object is a hash of what the controller last set: a field the new
// spec drops (a toleration, a limit, a node selector) changes it, where comparing the stored
// object with the desired one cannot tell a field removed from one the API server defaulted.
const annotationSpecHash = "registry.quartermaster.dev/spec-hash"

// specHash hashes obj's content: its labels and everything but its metadata.
func specHash(obj client.Object) (string, error) {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return "", err
	}
	delete(u, "metadata")
	delete(u, "status")
	b, err := json.Marshal([]any{obj.GetLabels(), u})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

func merged(base, over map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(over))
	maps.Copy(out, base)
	maps.Copy(out, over)
	return out
}

// keepOthers carries into desired, before an update, what others set on current: labels,
// annotations and finalizers of the object, and annotations of a pod template (kubectl rollout
// restart's, say), so an update of ours does not undo them or roll the pods again.
func keepOthers(desired, current client.Object) {
	desired.SetLabels(merged(current.GetLabels(), desired.GetLabels()))
	desired.SetAnnotations(merged(current.GetAnnotations(), desired.GetAnnotations()))
	desired.SetFinalizers(current.GetFinalizers())
	switch d := desired.(type) {
	case *appsv1.StatefulSet:
		c := current.(*appsv1.StatefulSet)
		d.Spec.Template.Annotations = merged(c.Spec.Template.Annotations, d.Spec.Template.Annotations)
	case *appsv1.DaemonSet:
		c := current.(*appsv1.DaemonSet)
		d.Spec.Template.Annotations = merged(c.Spec.Template.Annotations, d.Spec.Template.Annotations)
	}
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
		c := current.(*appsv1.StatefulSet)
		return samePodShape(&d.Spec.Template.Spec, &c.Spec.Template.Spec) && equality.Semantic.DeepDerivative(d.Spec, c.Spec)
	case *appsv1.DaemonSet:
		c := current.(*appsv1.DaemonSet)
		return samePodShape(&d.Spec.Template.Spec, &c.Spec.Template.Spec) && equality.Semantic.DeepDerivative(d.Spec, c.Spec)
	case *policyv1.PodDisruptionBudget:
		return equality.Semantic.DeepDerivative(d.Spec, current.(*policyv1.PodDisruptionBudget).Spec)
	}
	return false
}

// samePodShape: no container, init container or volume added by hand (DeepDerivative reads a
// longer stored list as matching a shorter desired one).
func samePodShape(desired, current *corev1.PodSpec) bool {
	return len(desired.Containers) == len(current.Containers) && len(desired.InitContainers) == len(current.InitContainers) &&
		len(desired.Volumes) == len(current.Volumes) && len(desired.Tolerations) == len(current.Tolerations) &&
		len(desired.NodeSelector) == len(current.NodeSelector)
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
