package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// Kyverno's reports as the impacts read them: whether they can be read (its report kind served,
// its reports controller running), a cache of them compacted to what the impacts need, indexed by
// the policies they have results of.

// PolicyReportKind is the kind Kyverno's reports controller writes by default.
var PolicyReportKind = schema.GroupVersionKind{Group: "wgpolicyk8s.io", Version: "v1alpha2", Kind: "PolicyReport"}

// ReportsControllerLease is the leader-election Lease of Kyverno's reports controller, in Kyverno's
// namespace: held and renewed while one runs.
const ReportsControllerLease = "kyverno-reports-controller"

const (
	// indexReportPolicies indexes compacted reports by every policy with a result in them.
	indexReportPolicies = "qm.results.policy"
	// leaseSlack is how long past its duration a Lease counts as held: a renewal delayed by a
	// busy API server is not taken for a stopped controller.
	leaseSlack = 10 * time.Second
	// ReadTimeout bounds an impact's reads of the report cache.
	ReadTimeout = 10 * time.Second
)

// +kubebuilder:rbac:groups=wgpolicyk8s.io,resources=policyreports,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get,resourceNames=kyverno-reports-controller

// Reports follows Kyverno's reports: whether they can be read, and what they say of the policies
// the controller generated.
type Reports struct {
	cache     cache.Cache // PolicyReports, compacted (compactReport) and indexed
	reader    client.Reader
	engines   *Engines
	objects   cache.Cache   // the engine policies (a report names a policy: its owner is a target)
	bindings  client.Reader // the bindings (the manager's cache)
	namespace string        // Kyverno's: where its reports controller's Lease is
	interval  time.Duration
	now       func() time.Time
	log       logr.Logger

	mu       sync.Mutex
	state    State
	watchers []stateWatcher // the controllers told of the state's changes (stateChanges)

	indexOnce sync.Once
	indexErr  error
}

// State is whether the impact can be read from the reports now, and if not, why.
type State struct {
	Readable bool
	Why      string // when not readable: for status.impact.message
}

// ReportsNeed is what the report watches wait for: the kind served (Kinds).
var ReportsNeed = controllers.Need{Name: "Kyverno's PolicyReports", Kinds: []schema.GroupVersionKind{PolicyReportKind}}

// stateWatcher is one controller's subscription to the reports' state: at each change, what keys
// returns is added to its queue.
type stateWatcher struct {
	q    controllers.Queue
	keys func(ctx context.Context) ([]client.ObjectKey, error)
}

// stateChanges is a source for a controller whose status shows what the reports say: at each
// change of their state (readable or not, and why), the objects keys returns are reconciled.
func (r *Reports) stateChanges(keys func(ctx context.Context) ([]client.ObjectKey, error)) source.Source {
	return source.Func(func(_ context.Context, q controllers.Queue) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.watchers = append(r.watchers, stateWatcher{q: q, keys: keys})
		return nil
	})
}

// wake adds, to each subscribed controller's queue, what its keys return.
func (r *Reports) wake(ctx context.Context) error {
	r.mu.Lock()
	watchers := slices.Clone(r.watchers)
	r.mu.Unlock()
	for _, w := range watchers {
		keys, err := w.keys(ctx)
		if err != nil {
			return err
		}
		for _, k := range keys {
			w.q.Add(reconcile.Request{NamespacedName: k})
		}
	}
	return nil
}

// NeedLeaderElection is true: it wakes leader-elected controllers.
func (r *Reports) NeedLeaderElection() bool { return true }

// Start polls the state until ctx ends.
func (r *Reports) Start(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		// At once on start: a replica that becomes leader long after it started has an old state.
		if previous, changed := r.check(ctx); changed {
			if err := r.wake(ctx); err != nil {
				r.log.Error(err, "waking the intents and bindings whose impact changed; looked at again", "in", r.interval)
				r.mu.Lock()
				r.state = previous // the next look sees the change again, and wakes
				r.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Current is the state as last checked.
func (r *Reports) Current() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// check looks at the state, and returns the state before and whether it changed.
func (r *Reports) check(ctx context.Context) (State, bool) {
	next := r.look(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	previous := r.state
	changed := next != previous
	if changed {
		r.log.Info("Kyverno's reports", "readable", next.Readable, "why", next.Why)
	}
	r.state = next
	return previous, changed
}

// look reads the state: Kyverno in use, its report kind served, its reports controller's Lease
// renewed within its duration.
func (r *Reports) look(ctx context.Context) State {
	if !r.engines.Available(intent.Kyverno) {
		if !r.engines.Enabled(intent.Kyverno) {
			return State{Why: "Kyverno is left out by --intents-engines, so nothing here scans existing workloads"}
		}
		return State{Why: "Kyverno is not installed, so nothing here scans existing workloads"}
	}
	if !r.engines.Kinds().Has(ReportsNeed) {
		if missing, failed := r.engines.Kinds().Missing(ReportsNeed); failed {
			return State{Why: "Kyverno's PolicyReports (" + PolicyReportKind.GroupVersion().String() + ") cannot be looked up: " + missing}
		}
		return State{Why: "Kyverno's PolicyReport kind (" + PolicyReportKind.GroupVersion().String() + ") is not served: Kyverno was installed without its report CRDs"}
	}
	if err := r.indexReports(ctx); err != nil {
		return State{Why: "Kyverno's PolicyReports cannot be indexed: " + err.Error()}
	}
	lease := &coordinationv1.Lease{}
	where := r.namespace + "/" + ReportsControllerLease
	if err := r.reader.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: ReportsControllerLease}, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return State{Why: "Kyverno's reports controller has never run here (no Lease " + where + "; --intents-kyverno-namespace names Kyverno's namespace)"}
		}
		return State{Why: "Kyverno's reports controller's Lease " + where + " cannot be read: " + err.Error()}
	}
	if lease.Spec.RenewTime == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return State{Why: "Kyverno's reports controller is not running (its Lease " + where + " has no holder)"}
	}
	duration := 15 * time.Second
	if lease.Spec.LeaseDurationSeconds != nil {
		duration = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}
	if renewed := lease.Spec.RenewTime.Time; r.now().After(renewed.Add(duration + leaseSlack)) {
		return State{Why: fmt.Sprintf("Kyverno's reports controller is not running (its Lease %s was last renewed at %s)", where, renewed.UTC().Format(time.RFC3339))}
	}
	return State{Readable: true}
}

// compactReport is the report cache's transform: a PolicyReport as intent.CompactReport keeps it.
func compactReport(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GroupVersionKind() != PolicyReportKind {
		return obj, nil
	}
	return intent.CompactReport(u), nil
}

func newPolicyReport() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(PolicyReportKind)
	return u
}

func newPolicyReportList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(PolicyReportKind.GroupVersion().WithKind(PolicyReportKind.Kind + "List"))
	return l
}

// newReportCache is the cache of PolicyReports; no informer runs in it, nor are its indexes added
// (indexReports, the report watches' Prepare), before the kind is served.
func newReportCache(mgr ctrl.Manager) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		// By default, not ByObject: that resolves the kind when the cache is made, and the kind
		// may be served only later. PolicyReports are all this cache holds.
		DefaultTransform: compactReport,
	})
	if err != nil {
		return nil, err
	}
	return c, controllers.AddCache(mgr, c)
}

// indexReports adds the report cache's indexes, once the kind is served (adding them resolves it).
func (r *Reports) indexReports(ctx context.Context) error {
	r.indexOnce.Do(func() {
		r.indexErr = r.cache.IndexField(ctx, newPolicyReport(), indexReportPolicies, func(o client.Object) []string {
			return intent.ReportPolicies(o.(*unstructured.Unstructured), false)
		})
	})
	return r.indexErr
}

// ReportsOf reads, from the report cache, the reports with results of a policy key.
func (r *Reports) ReportsOf(ctx context.Context) func(key string) ([]unstructured.Unstructured, error) {
	return func(key string) ([]unstructured.Unstructured, error) {
		list := newPolicyReportList()
		if err := r.cache.List(ctx, list, client.MatchingFields{indexReportPolicies: key}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		return list.Items, nil
	}
}

// targets maps a report to what its policies' impacts are shown on: the bindings whose
// (Cluster)NimbusPolicies own the policies, and the intents those bindings name. Policies the
// controller did not generate are passed over.
func (r *Reports) targets(ctx context.Context, keys []string) (sibs, csibs []client.ObjectKey, intents []string) {
	for _, key := range keys {
		namespace, name, namespaced := strings.Cut(key, "/")
		if !namespaced {
			namespace, name = "", key
		}
		_, gvk, parentKind := intent.KyvernoPolicyOf(namespace, name)
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gvk)
		if err := r.objects.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj); err != nil {
			continue
		}
		owner := ControllerNamed(obj, parentKind)
		if owner == "" {
			continue
		}
		// The (Cluster)NimbusPolicy has its binding's name.
		var named []intentv1alpha1.MatchIntent
		if namespaced {
			sib := &intentv1alpha1.SecurityIntentBinding{}
			if err := r.bindings.Get(ctx, client.ObjectKey{Namespace: namespace, Name: owner}, sib); err != nil {
				continue
			}
			sibs = append(sibs, client.ObjectKeyFromObject(sib))
			named = sib.Spec.Intents
		} else {
			csib := &intentv1alpha1.ClusterSecurityIntentBinding{}
			if err := r.bindings.Get(ctx, client.ObjectKey{Name: owner}, csib); err != nil {
				continue
			}
			csibs = append(csibs, client.ObjectKeyFromObject(csib))
			named = csib.Spec.Intents
		}
		for _, m := range named {
			if !slices.Contains(intents, m.Name) {
				intents = append(intents, m.Name)
			}
		}
	}
	return sibs, csibs, intents
}

// changes is the handler of the report watch for one kind of target (pick chooses among
// targets' results): a report's creation, deletion, or a change of which policies pass or
// fail on it (not of its timestamps) enqueues the targets after AggregateWindow.
func (r *Reports) changes(pick Picker) handler.EventHandler {
	enqueue := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		var keys []string
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				for _, p := range intent.ReportPolicies(u, false) {
					if !slices.Contains(keys, p) {
						keys = append(keys, p)
					}
				}
			}
		}
		sibs, csibs, intents := r.targets(ctx, keys)
		for _, k := range pick(ctx, sibs, csibs, intents) {
			q.AddAfter(reconcile.Request{NamespacedName: k}, AggregateWindow)
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, q, e.Object)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if sameVerdicts(e.ObjectOld, e.ObjectNew) {
				return
			}
			enqueue(ctx, q, e.ObjectOld, e.ObjectNew)
		},
	}
}

// sameVerdicts is intent.SameVerdicts of two versions of a cached report.
func sameVerdicts(a, b client.Object) bool {
	ua, ok1 := a.(*unstructured.Unstructured)
	ub, ok2 := b.(*unstructured.Unstructured)
	return ok1 && ok2 && intent.SameVerdicts(ua, ub)
}

// Picker chooses, of a report's targets, those of one controller.
type Picker = func(ctx context.Context, sibs, csibs []client.ObjectKey, intents []string) []client.ObjectKey

// Sources are one controller's sources of impacts: the reports' state changes (keys: its
// objects whose impact they change), and the report watch (Late: it starts once the kind is
// served, with the report cache's index added first). With Kyverno left out by --intents-engines
// no report is watched.
func (r *Reports) Sources(keys func(ctx context.Context) ([]client.ObjectKey, error), pick Picker) []source.Source {
	srcs := []source.Source{r.stateChanges(keys)}
	if r.engines.Enabled(intent.Kyverno) {
		srcs = append(srcs, r.engines.Kinds().Watch(ReportsNeed, r.cache, newPolicyReport(), r.changes(pick)).Prepare(r.indexReports))
	}
	return srcs
}

// AggregateWindow is how long an object whose status sums up many others (a SecurityIntent over
// its bindings, a cluster binding over its namespaces' NimbusPolicies, an impact over a
// namespace's reports) waits after a change of one of them before it is reconciled. Changes
// within the window make one reconcile: a burst of 1000 bindings becoming Ready is a few
// reconciles and status writes of the intent, not hundreds (measured in make bench,
// intents/1000-bindings). A change of what the object asks for (creations, deletions, spec and
// label changes) is not delayed.
const AggregateWindow = time.Second

// NewReports makes the follower of Kyverno's reports, with a cache of its own, read every interval
// (their reports controller's Lease in namespace, Kyverno's) while the manager leads; add it to the
// manager (it is a runnable) and call Init before the controllers are built.
func NewReports(mgr ctrl.Manager, engines *Engines, objects cache.Cache, namespace string, interval time.Duration) (*Reports, error) {
	c, err := newReportCache(mgr)
	if err != nil {
		return nil, err
	}
	return &Reports{cache: c, reader: mgr.GetAPIReader(), engines: engines, objects: objects, bindings: mgr.GetClient(),
		namespace: namespace, interval: interval, now: time.Now, log: mgr.GetLogger().WithName("intents")}, nil
}

// Init reads the state now (the report kind served at the start is known before the first
// reconcile, its watches synced before it).
func (r *Reports) Init(ctx context.Context) {
	r.engines.Kinds().Check(ctx, ReportsNeed)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state = r.look(ctx)
}
