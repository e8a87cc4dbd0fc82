package mirrors

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unique"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// Pinning by use (mirror.Pins): the controller learns which images the cluster's workloads name
// from a cache of its own that keeps, of each Pod and workload template, only its name and its
// images (usageCache), and writes each mirror's pins ConfigMap from it.
//
// Every namespace's Pods and workloads are read, never written, and only their images are kept: a
// ClusterRole of its own, quartermaster-mirrors-pins, that the chart installs only with
// mirrors.pinByUse. The pins ConfigMaps are written either way (emptied when pinning is off).
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch,roleName=quartermaster-mirrors-pins
// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets;daemonsets,verbs=list;watch,roleName=quartermaster-mirrors-pins
// +kubebuilder:rbac:groups=batch,resources=jobs;cronjobs,verbs=list;watch,roleName=quartermaster-mirrors-pins
// The nodes' platforms (their kubernetes.io/os and kubernetes.io/arch labels alone are kept): the
// cache warms a multi-platform image for each.
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch,roleName=quartermaster-mirrors-pins
// +kubebuilder:rbac:groups="",namespace=quartermaster-mirrors,resources=configmaps,verbs=get;list;watch;create;update

// indexImageHost indexes Pods and workloads by the registry hosts of their images.
const indexImageHost = "quartermaster.dev/image-hosts"

// usageKinds are the objects whose images are pinned: Pods, and the templates of the workloads
// that make them (a Deployment scaled to zero still says what it will run).
func usageKinds() []client.Object {
	return []client.Object{&corev1.Pod{}, &appsv1.Deployment{}, &appsv1.StatefulSet{}, &appsv1.DaemonSet{}, &batchv1.Job{}, &batchv1.CronJob{}}
}

// podSpecOf is the pod spec an object runs or will run (nil for another kind).
func podSpecOf(obj client.Object) *corev1.PodSpec {
	switch o := obj.(type) {
	case *corev1.Pod:
		return &o.Spec
	case *appsv1.Deployment:
		return &o.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &o.Spec.Template.Spec
	case *appsv1.DaemonSet:
		return &o.Spec.Template.Spec
	case *batchv1.Job:
		return &o.Spec.Template.Spec
	case *batchv1.CronJob:
		return &o.Spec.JobTemplate.Spec.Template.Spec
	}
	return nil
}

// imagesOf lists the images of what the usage cache keeps of an object (imageUse): none for a Pod
// that ended, which pulls nothing more.
func imagesOf(obj client.Object) []string {
	if u, ok := obj.(*imageUse); ok && !u.Ended {
		return u.Images
	}
	return nil
}

func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// imageUse is what the usage cache keeps of a Pod or a workload: its name and namespace, its
// images (one copy of each image string for all objects), and whether it is a Pod that ended.
// 0.6 KB per Pod where a stripped corev1.Pod took 2.4 KB (TestUsageCacheCost).
type imageUse struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Images            []string
	Ended             bool
}

// DeepCopyObject copies u; its image strings are never changed, so the slice is shared.
func (u *imageUse) DeepCopyObject() runtime.Object {
	c := *u
	u.DeepCopyInto(&c.ObjectMeta)
	return &c
}

// keepImages is the usage cache's transform: an object becomes its imageUse.
func keepImages(in any) (any, error) {
	obj, ok := in.(client.Object)
	if !ok {
		return in, nil // a tombstone: the informer's own
	}
	if _, done := obj.(*imageUse); done {
		return obj, nil
	}
	images := imagesOfAll(obj)
	for i, img := range images {
		images[i] = unique.Make(img).Value()
	}
	p, isPod := obj.(*corev1.Pod)
	return &imageUse{
		ObjectMeta: metav1.ObjectMeta{Name: obj.GetName(), Namespace: obj.GetNamespace(), ResourceVersion: obj.GetResourceVersion()},
		Images:     slices.Clip(images),
		Ended:      isPod && podEnded(p),
	}, nil
}

// imagesOfAll is every image of obj, ended Pod or not (the transform keeps them; imagesOf decides).
func imagesOfAll(obj client.Object) []string {
	spec := podSpecOf(obj)
	if spec == nil {
		return nil
	}
	out := make([]string, 0, len(spec.InitContainers)+len(spec.Containers)+len(spec.EphemeralContainers))
	for _, c := range spec.InitContainers {
		out = append(out, c.Image)
	}
	for _, c := range spec.Containers {
		out = append(out, c.Image)
	}
	for _, c := range spec.EphemeralContainers {
		out = append(out, c.Image)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// imageHosts are the registry hosts of obj's images (the index, and the mirrors an event wakes).
func imageHosts(obj client.Object) []string {
	var hosts []string
	for _, img := range imagesOf(obj) {
		if h := mirror.ImageHost(img); h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// byImageHost is the usage informers' index function (indexImageHost).
func byImageHost(o any) ([]string, error) {
	if obj, ok := o.(client.Object); ok {
		return imageHosts(obj), nil
	}
	return nil, nil
}

// usageCache is the cluster-wide cache of Pods and workloads that pinning reads, with the index by
// image host of each kind's informer (its objects are imageUse, not the kinds' types: they are
// read through the index, never through the cache's typed List), and the Nodes, of which it keeps
// the platform labels alone.
type usageCache struct {
	cache.Cache
	byHost []toolscache.Indexer
	nodes  toolscache.Store
}

func newUsageCache(mgr ctrl.Manager) (*usageCache, error) {
	byObject := map[client.Object]cache.ByObject{&corev1.Node{}: {Transform: keepPlatform}}
	for _, obj := range usageKinds() {
		byObject[obj] = cache.ByObject{Transform: keepImages}
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), ByObject: byObject,
	})
	if err != nil {
		return nil, err
	}
	u := &usageCache{Cache: c}
	informer := func(obj client.Object) (toolscache.SharedIndexInformer, error) {
		inf, err := c.GetInformer(context.Background(), obj, cache.BlockUntilSynced(false))
		if err != nil {
			return nil, err
		}
		shared, ok := inf.(toolscache.SharedIndexInformer)
		if !ok {
			return nil, fmt.Errorf("the usage cache's informer of %T is a %T, not a shared index informer", obj, inf)
		}
		return shared, nil
	}
	for _, obj := range usageKinds() {
		inf, err := informer(obj)
		if err != nil {
			return nil, err
		}
		if err := inf.AddIndexers(toolscache.Indexers{indexImageHost: byImageHost}); err != nil {
			return nil, err
		}
		u.byHost = append(u.byHost, inf.GetIndexer())
	}
	nodes, err := informer(&corev1.Node{})
	if err != nil {
		return nil, err
	}
	u.nodes = nodes.GetStore()
	return u, controllers.AddCache(mgr, c)
}

// keepPlatform is the usage cache's transform of a Node: its name and platform labels alone.
func keepPlatform(in any) (any, error) {
	n, ok := in.(*corev1.Node)
	if !ok {
		return in, nil // a tombstone
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
		Labels: map[string]string{corev1.LabelOSStable: n.Labels[corev1.LabelOSStable], corev1.LabelArchStable: n.Labels[corev1.LabelArchStable]},
	}}, nil
}

func platformOf(obj client.Object) string {
	l := obj.GetLabels()
	return mirror.Platform(l[corev1.LabelOSStable], l[corev1.LabelArchStable])
}

// platforms are the cluster's nodes' platforms, sorted.
func (u *usageCache) platforms() []string {
	seen := map[string]bool{}
	for _, o := range u.nodes.List() {
		if obj, ok := o.(client.Object); ok {
			if p := platformOf(obj); p != "" {
				seen[p] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// usageSources wake the mirrors of the hosts whose images an object starts or stops naming.
func (r *Reconciler) usageSources() []source.Source {
	changed := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !slices.Equal(imagesOf(e.ObjectOld), imagesOf(e.ObjectNew))
	}}
	var out []source.Source
	for _, obj := range usageKinds() {
		out = append(out, source.Kind(r.usage, obj, handler.EnqueueRequestsFromMapFunc(r.mirrorsOfImages), changed))
	}
	// A node that comes, goes or changes platform may change the platforms every mirror warms.
	platformChanged := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return platformOf(e.ObjectOld) != platformOf(e.ObjectNew)
	}}
	out = append(out, source.Kind(r.usage, client.Object(&corev1.Node{}), handler.EnqueueRequestsFromMapFunc(r.allMirrors), platformChanged))
	return out
}

// allMirrors maps an object to every mirror.
func (r *Reconciler) allMirrors(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &registryv1alpha1.RegistryMirrorList{}
	if err := r.client.List(ctx, list); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, rm := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: rm.Name}})
	}
	return out
}

// mirrorsOfImages maps an object to the mirrors of its images' hosts.
func (r *Reconciler) mirrorsOfImages(ctx context.Context, obj client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, host := range imageHosts(obj) {
		list := &registryv1alpha1.RegistryMirrorList{}
		if err := r.client.List(ctx, list, client.MatchingFields{indexMirrorHost: host}); err != nil {
			continue
		}
		for _, rm := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: rm.Name}})
		}
	}
	return out
}

// pinned is the mirror's pins: the images spec.prefetch lists (ignored: those of another host),
// every image a Pod or workload names through the mirror's host, and
// for ttl after the last reference went each one the current pins ConfigMap had (0 ttl: none, the
// content is kept forever anyway). next is when the earliest of those ends (0: none).
func (r *Reconciler) pinned(ctx context.Context, spec mirror.Spec) (p mirror.Pins, next time.Duration, ignored []string, err error) {
	p = mirror.Pins{Images: map[string]string{}}
	// spec.prefetch is pinned for as long as it lists the image, pinning by use on or off.
	for _, img := range spec.Prefetch {
		if ref, ok := mirror.PinRef(img, spec.MirrorHost); ok {
			p.Images[ref] = ""
		} else {
			ignored = append(ignored, img)
		}
	}
	if r.usage == nil {
		return p, 0, ignored, nil // pinning by use is off: what workloads name is released
	}
	p.Platforms = r.usage.platforms()
	for _, idx := range r.usage.byHost {
		list, err := idx.ByIndex(indexImageHost, strings.ToLower(spec.MirrorHost))
		if err != nil {
			return p, 0, nil, err
		}
		for _, o := range list {
			obj, ok := o.(client.Object)
			if !ok {
				continue
			}
			for _, img := range imagesOf(obj) {
				if ref, ok := mirror.PinRef(img, spec.MirrorHost); ok {
					p.Images[ref] = ""
				}
			}
		}
	}
	current := &corev1.ConfigMap{}
	err = r.objects.Get(ctx, client.ObjectKey{Namespace: r.install.Namespace, Name: mirror.PinsName(spec.Name)}, current)
	if apierrors.IsNotFound(err) {
		return p, 0, ignored, nil
	}
	if err != nil {
		return p, 0, nil, err
	}
	before, err := mirror.ParsePins([]byte(current.Data[mirror.PinsFile]))
	if err != nil || spec.TTL == 0 {
		return p, 0, ignored, nil //nolint:nilerr // a file that does not parse is written anew from what is in use
	}
	now := r.now()
	for ref, until := range before.Images {
		if _, inUse := p.Images[ref]; inUse {
			continue
		}
		end := now.Add(spec.TTL)
		if until != "" {
			if end, err = time.Parse(time.RFC3339, until); err != nil {
				continue
			}
		}
		left := end.Sub(now)
		if left <= 0 {
			continue
		}
		p.Images[ref] = end.UTC().Format(time.RFC3339)
		if next == 0 || left < next {
			next = left
		}
	}
	return p, next, ignored, nil
}
