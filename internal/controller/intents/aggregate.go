package intents

import (
	"context"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
)

// readinessCoalesced is a handler that enqueues the objects mapped from a watched one: at once for
// creations, deletions and generation or label changes; after cluster.AggregateWindow for any other
// update (a readiness change, which the watch's predicates pass). The queue keeps one entry per
// object, so the updates of a window coalesce.
func readinessCoalesced(mapped handler.MapFunc) handler.EventHandler {
	now := func(ctx context.Context, obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, r := range mapped(ctx, obj) {
			q.Add(r)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			now(ctx, e.Object, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			now(ctx, e.Object, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			now(ctx, e.Object, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() || !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
				now(ctx, e.ObjectNew, q)
				return
			}
			for _, r := range mapped(ctx, e.ObjectNew) {
				q.AddAfter(r, cluster.AggregateWindow)
			}
		},
	}
}

// reportPriority is the workqueue priority of a reconcile that only reports (a binding woken by its
// NimbusPolicy's readiness): below every reconcile that enforces, including the low priority
// controller-runtime gives the objects it lists at start (handler.LowPriority). With 1000
// bindings at start, their NimbusPolicies and engine policies are all written before the bindings
// report, instead of the reports taking half the workers while policies wait.
const reportPriority = handler.LowPriority - 1

// toReport is a handler that enqueues the controller (of kind) of a watched object at
// reportPriority on an update: the watch's predicates pass the readiness changes the controller
// reports. Without controller-runtime's priority queue it enqueues plainly.
func toReport(kind string) handler.EventHandler {
	return handler.Funcs{
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			owner := metav1.GetControllerOfNoCopy(e.ObjectNew)
			if owner == nil || owner.Kind != kind {
				return
			}
			r := reconcile.Request{NamespacedName: client.ObjectKey{Namespace: e.ObjectNew.GetNamespace(), Name: owner.Name}}
			if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
				pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(reportPriority)}, r)
				return
			}
			q.Add(r)
		},
	}
}
