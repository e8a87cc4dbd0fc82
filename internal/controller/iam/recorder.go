package iam

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// quietWhileNamespaceTerminates drops Events about objects in a namespace that is being deleted:
// the API server refuses to create anything there, and client-go logs every refusal with a stack
// trace (thousands when a namespace full of IAM objects goes). It learns the namespaces' state
// from a metadata-only cache of its own (the shared cache may be narrowed to another controller's
// Namespaces), so an Event costs no API request.
type quietWhileNamespaceTerminates struct {
	events.EventRecorder
	namespaces client.Reader
}

// newQuietRecorder wraps rec, with a Namespace metadata cache that the manager starts.
func newQuietRecorder(mgr ctrl.Manager, rec events.EventRecorder) (*quietWhileNamespaceTerminates, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultTransform: cachemeta.Transform,
	})
	if err != nil {
		return nil, err
	}
	// The informer is made now, so it starts with the cache (which the manager runs with the
	// controllers, not before them): an Event recorded before its first sync waits for it at most
	// a second, then goes out (and is at worst refused).
	if _, err := c.GetInformer(context.Background(), namespaceMetadata(), cache.BlockUntilSynced(false)); err != nil {
		return nil, err
	}
	if err := controllers.AddCache(mgr, c); err != nil {
		return nil, err
	}
	return &quietWhileNamespaceTerminates{EventRecorder: rec, namespaces: c}, nil
}

func namespaceMetadata() *metav1.PartialObjectMetadata {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return ns
}

func (r *quietWhileNamespaceTerminates) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	if obj, ok := regarding.(client.Object); ok && obj.GetNamespace() != "" && r.terminating(obj.GetNamespace()) {
		return
	}
	r.EventRecorder.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

func (r *quietWhileNamespaceTerminates) terminating(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ns := namespaceMetadata()
	// On a read error the Event is sent: a refused Event is better than one silently lost.
	return r.namespaces.Get(ctx, client.ObjectKey{Name: name}, ns) == nil && !ns.DeletionTimestamp.IsZero()
}
