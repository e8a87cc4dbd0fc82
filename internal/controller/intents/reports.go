package intents

import (
	"context"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// Enforcement first: a NimbusPolicy's pass that writes engine policies leaves its status report to
// a later pass, so that the API server, which is what limits a burst, takes the engine policies of
// every NimbusPolicy before anyone's report. A NimbusPolicy's status update costs the API server
// about as much as the two creates that enforce it (itself and its engine policy): written as they
// came, the reports of a cluster binding over 500 namespaces delayed the last namespace's
// NetworkPolicy by half (make bench, intents/cluster-binding-500-namespaces: 3.2 s, now 1.7 s; the
// last report comes when it did).
//
//   - While the NimbusPolicy's cluster binding is writing (its pass over the namespaces), the report
//     is held until that pass ends.
//   - Otherwise it is queued at reportPriority: behind every NimbusPolicy waiting to be enforced.
//
// Either way the report pass runs once more, reading from the cache, and reports what the passes
// before it did (their changes make its Event; the policies they made count as made, so a cache
// that has not seen them yet is not taken for their absence). The pass after a deferral reports,
// whatever it finds: a report is never put off twice.
//
// What is deferred lives in memory: a restart loses only the Event, as the next start reads every
// policy from a synced cache and reports.
type deferredReports struct {
	release chan event.GenericEvent // the held NimbusPolicies, when their binding's pass ends

	mu      sync.Mutex
	writing map[types.UID][]types.NamespacedName // by cluster binding writing now: the reports held
	pending map[types.NamespacedName]pendingReport
}

// reportPriority ranks a report pass behind every other, those of the start included.
const reportPriority = handler.LowPriority - 1

// pendingReport is what a NimbusPolicy's passes wrote and its status does not say yet.
type pendingReport struct {
	uid     types.UID // of the NimbusPolicy: one made anew under the same name reports its own
	entries []string  // the policies made, as status.adapterPolicies lists them
	changes []string  // for the report's Event
}

func newDeferredReports() *deferredReports {
	return &deferredReports{
		release: make(chan event.GenericEvent, 64),
		writing: map[types.UID][]types.NamespacedName{},
		pending: map[types.NamespacedName]pendingReport{},
	}
}

// writingFor marks the cluster binding's pass as writing, until the returned func is called.
func (d *deferredReports) writingFor(binding types.UID) (done func()) {
	d.mu.Lock()
	d.writing[binding] = nil
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		held := d.writing[binding]
		delete(d.writing, binding)
		d.mu.Unlock()
		if len(held) == 0 {
			return
		}
		go func() { // the binding's reconcile does not wait on the policy controller
			for _, key := range held {
				d.release <- event.GenericEvent{Object: &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}
			}
		}()
	}
}

// released enqueues a held NimbusPolicy's report pass at reportPriority.
func (d *deferredReports) released() handler.EventHandler {
	return handler.Funcs{GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: e.Object.GetNamespace(), Name: e.Object.GetName()}}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: new(reportPriority)}, req)
			return
		}
		q.Add(req)
	}}
}

// unreported takes what np's earlier passes did and did not report (nothing when none deferred).
func (d *deferredReports) unreported(np *intentv1alpha1.NimbusPolicy) pendingReport {
	key := types.NamespacedName{Namespace: np.Namespace, Name: np.Name}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pending[key]
	delete(d.pending, key)
	if p.uid != np.UID {
		return pendingReport{}
	}
	return p
}

// forget drops what is pending for a NimbusPolicy that is gone.
func (d *deferredReports) forget(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pending, key)
}

// later defers np's report when this pass wrote (a) and the report was not deferred before
// (earlier), keeping what the passes did; it returns whether it did and how the pass ends then.
func (d *deferredReports) later(np *intentv1alpha1.NimbusPolicy, earlier pendingReport, a applied) (reconcile.Result, bool) {
	if len(a.changes) == 0 {
		return reconcile.Result{}, false
	}
	key := types.NamespacedName{Namespace: np.Namespace, Name: np.Name}
	d.mu.Lock()
	defer d.mu.Unlock()
	var held []types.NamespacedName
	writing := false
	if ref := metav1.GetControllerOfNoCopy(np); ref != nil {
		held, writing = d.writing[ref.UID]
	}
	if !writing && len(earlier.changes) > 0 {
		return reconcile.Result{}, false // deferred once already: this pass reports
	}
	d.pending[key] = pendingReport{uid: np.UID, entries: a.entries, changes: slices.Concat(earlier.changes, a.changes)}
	if !writing {
		return reconcile.Result{RequeueAfter: time.Millisecond, Priority: new(reportPriority)}, true
	}
	if !slices.Contains(held, key) {
		d.writing[metav1.GetControllerOfNoCopy(np).UID] = append(held, key)
	}
	return reconcile.Result{}, true // its binding's pass releases it
}
