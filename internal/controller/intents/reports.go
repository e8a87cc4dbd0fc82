package intents

import (
	"context"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// Enforcement first: a cluster binding's NimbusPolicies report once the binding is enforced in
// every namespace it was written to. Over hundreds of namespaces the API server is what limits a
// cluster binding, and a NimbusPolicy's status update costs it about as much as the two creates
// that enforce a namespace (the NimbusPolicy and its engine policy): written as they came, the
// reports delayed the last namespace's NetworkPolicy by half (make bench,
// intents/cluster-binding-500-namespaces: 3.2 s, now 1.6–1.9 s; the last report comes when it did).
//
// A policy pass that wrote engine policies for a cluster binding's NimbusPolicy does not write its
// status while the binding is not yet enforced: its pass over the namespaces is running, or a
// NimbusPolicy it created has not had its first pass. The report is held; when the binding is
// enforced, every held NimbusPolicy is reconciled again and reports, reading from the cache, what
// the passes before it did (their changes make its Event; what they made counts as made, so a
// cache that has not seen it yet is not taken for its absence).
//
// Every NimbusPolicy the binding created is reconciled (its creation is watched), and each of the
// policy controller's passes either marks it passed or forgets it, so a binding's enforcement
// always completes. What is held lives in memory: a restart loses only the Event, as the next start
// reads every policy from a synced cache and reports.
type deferredReports struct {
	mu       sync.Mutex
	bindings map[types.UID]*enforcement // cluster bindings not yet enforced
	pending  map[types.NamespacedName]pendingReport
	queue    controllers.Queue      // the policy controller's, once it started (released)
	unsent   []types.NamespacedName // released before it started
}

// enforcement is how far a cluster binding's enforcement is.
type enforcement struct {
	writing  bool                          // its pass over the namespaces is running
	awaiting map[types.NamespacedName]bool // NimbusPolicies it created whose first pass has not run
	held     []types.NamespacedName        // the reports waiting
}

func (e *enforcement) enforced() bool { return !e.writing && len(e.awaiting) == 0 }

// pendingReport is what a held NimbusPolicy's passes wrote and its status does not say yet.
type pendingReport struct {
	uid     types.UID // of the NimbusPolicy: one made anew under the same name reports its own
	entries []string  // the policies made, as status.adapterPolicies lists them
	changes []string  // for the report's Event
}

func newDeferredReports() *deferredReports {
	return &deferredReports{
		bindings: map[types.UID]*enforcement{},
		pending:  map[types.NamespacedName]pendingReport{},
	}
}

// locked returns the binding's enforcement, made when missing; d.mu is held.
func (d *deferredReports) locked(binding types.UID) *enforcement {
	e := d.bindings[binding]
	if e == nil {
		e = &enforcement{awaiting: map[types.NamespacedName]bool{}}
		d.bindings[binding] = e
	}
	return e
}

// writingFor marks the cluster binding's pass over its namespaces as running, until the returned
// func is called (a binding's reconciles never run at once).
func (d *deferredReports) writingFor(binding types.UID) (done func()) {
	d.mu.Lock()
	d.locked(binding).writing = true
	d.mu.Unlock()
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.locked(binding).writing = false
		d.releaseIfEnforced(binding)
	}
}

// creating tells that the binding's pass is about to write its NimbusPolicy key; the returned func
// says whether it created it (only a creation is sure to be reconciled: its watch passes it).
func (d *deferredReports) creating(binding types.UID, key types.NamespacedName) (created func(bool)) {
	d.mu.Lock()
	awaiting := d.locked(binding).awaiting
	before := awaiting[key] // created by an earlier pass, its first pass yet to come
	awaiting[key] = true
	d.mu.Unlock()
	return func(made bool) {
		if made || before {
			return // its first pass clears it (passed), before or after this
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		delete(d.locked(binding).awaiting, key)
		d.releaseIfEnforced(binding)
	}
}

// passed records np's pass (a, err) and holds its report when it or an earlier held pass wrote
// engine policies and np's cluster binding is not yet enforced, keeping what np's passes did
// (earlier and a); it reports whether it held it.
func (d *deferredReports) passed(np *intentv1alpha1.NimbusPolicy, earlier pendingReport, a intent.Applied, err error) bool {
	ref := metav1.GetControllerOfNoCopy(np)
	if ref == nil {
		return false
	}
	key := types.NamespacedName{Namespace: np.Namespace, Name: np.Name}
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.bindings[ref.UID]
	if e == nil {
		return false // enforced: no pass of the binding is running, and nothing it created awaits
	}
	delete(e.awaiting, key)
	if err != nil || len(earlier.changes)+len(a.Changes) == 0 || e.enforced() {
		d.releaseIfEnforced(ref.UID)
		return false
	}
	d.pending[key] = pendingReport{uid: np.UID, entries: a.Entries, changes: slices.Concat(earlier.changes, a.Changes)}
	if !slices.Contains(e.held, key) {
		e.held = append(e.held, key)
	}
	return true
}

// forget drops a NimbusPolicy that is gone (or no longer generates anything) from everything
// waiting for it.
func (d *deferredReports) forget(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.pending, key)
	for binding, e := range d.bindings {
		if e.awaiting[key] {
			delete(e.awaiting, key)
			d.releaseIfEnforced(binding)
		}
	}
}

// unreported takes what np's held passes did (nothing when none was held).
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

// releaseIfEnforced reconciles the binding's held NimbusPolicies once it is enforced; d.mu is held.
func (d *deferredReports) releaseIfEnforced(binding types.UID) {
	e := d.bindings[binding]
	if e == nil || !e.enforced() {
		return
	}
	delete(d.bindings, binding)
	for _, key := range e.held {
		if d.queue == nil {
			d.unsent = append(d.unsent, key)
			continue
		}
		d.queue.Add(reconcile.Request{NamespacedName: key})
	}
}

// released is the policy controller's source of the held NimbusPolicies, once their binding is
// enforced (the queue does not block: neither the binding's reconcile nor a policy's waits on it).
func (d *deferredReports) released() source.Source {
	return source.Func(func(_ context.Context, q controllers.Queue) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.queue = q
		for _, key := range d.unsent {
			q.Add(reconcile.Request{NamespacedName: key})
		}
		d.unsent = nil
		return nil
	})
}
