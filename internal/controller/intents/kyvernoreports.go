package intents

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
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

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
	// reportReadTimeout bounds an impact's reads of the report cache.
	reportReadTimeout = 10 * time.Second
)

// +kubebuilder:rbac:groups=wgpolicyk8s.io,resources=policyreports,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get,resourceNames=kyverno-reports-controller

// reports follows Kyverno's reports: whether they can be read, and what they say of the policies
// the controller generated.
type reports struct {
	cache     cache.Cache // PolicyReports, compacted (compactReport) and indexed
	reader    client.Reader
	engines   *engines
	namespace string // Kyverno's: where its reports controller's Lease is
	interval  time.Duration
	now       func() time.Time
	log       logr.Logger

	mu       sync.Mutex
	state    reportsState
	watchers []stateWatcher // the controllers told of the state's changes (stateChanges)

	indexOnce sync.Once
	indexErr  error
}

// reportsState is whether the impact can be read from the reports now, and if not, why.
type reportsState struct {
	readable bool
	why      string // when not readable: for status.impact.message
}

// reportsNeed is what the report watches wait for: the kind served (Kinds).
var reportsNeed = controllers.Need{Name: "Kyverno's PolicyReports", Kinds: []schema.GroupVersionKind{PolicyReportKind}}

// stateWatcher is one controller's subscription to the reports' state: at each change, what keys
// returns is added to its queue.
type stateWatcher struct {
	q    controllers.Queue
	keys func(ctx context.Context) ([]client.ObjectKey, error)
}

// stateChanges is a source for a controller whose status shows what the reports say: at each
// change of their state (readable or not, and why), the objects keys returns are reconciled.
func (r *reports) stateChanges(keys func(ctx context.Context) ([]client.ObjectKey, error)) source.Source {
	return source.Func(func(_ context.Context, q controllers.Queue) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.watchers = append(r.watchers, stateWatcher{q: q, keys: keys})
		return nil
	})
}

// wake adds, to each subscribed controller's queue, what its keys return.
func (r *reports) wake(ctx context.Context) error {
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
func (r *reports) NeedLeaderElection() bool { return true }

// Start polls the state until ctx ends.
func (r *reports) Start(ctx context.Context) error {
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

// current is the state as last checked.
func (r *reports) current() reportsState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// check looks at the state, and returns the state before and whether it changed.
func (r *reports) check(ctx context.Context) (reportsState, bool) {
	next := r.look(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	previous := r.state
	changed := next != previous
	if changed {
		r.log.Info("Kyverno's reports", "readable", next.readable, "why", next.why)
	}
	r.state = next
	return previous, changed
}

// look reads the state: Kyverno in use, its report kind served, its reports controller's Lease
// renewed within its duration.
func (r *reports) look(ctx context.Context) reportsState {
	if !r.engines.available(intent.Kyverno) {
		if !r.engines.enabled(intent.Kyverno) {
			return reportsState{why: "Kyverno is left out by --intents-engines, so nothing here scans existing workloads"}
		}
		return reportsState{why: "Kyverno is not installed, so nothing here scans existing workloads"}
	}
	if !r.engines.kinds.Has(reportsNeed) {
		if missing := r.engines.kinds.Missing(reportsNeed); strings.Contains(missing, "failed") {
			return reportsState{why: "Kyverno's PolicyReports (" + PolicyReportKind.GroupVersion().String() + ") cannot be looked up: " + missing}
		}
		return reportsState{why: "Kyverno's PolicyReport kind (" + PolicyReportKind.GroupVersion().String() + ") is not served: Kyverno was installed without its report CRDs"}
	}
	if err := r.indexReports(ctx); err != nil {
		return reportsState{why: "Kyverno's PolicyReports cannot be indexed: " + err.Error()}
	}
	lease := &coordinationv1.Lease{}
	where := r.namespace + "/" + ReportsControllerLease
	if err := r.reader.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: ReportsControllerLease}, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return reportsState{why: "Kyverno's reports controller has never run here (no Lease " + where + "; --intents-kyverno-namespace names Kyverno's namespace)"}
		}
		return reportsState{why: "Kyverno's reports controller's Lease " + where + " cannot be read: " + err.Error()}
	}
	if lease.Spec.RenewTime == nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return reportsState{why: "Kyverno's reports controller is not running (its Lease " + where + " has no holder)"}
	}
	duration := 15 * time.Second
	if lease.Spec.LeaseDurationSeconds != nil {
		duration = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}
	if renewed := lease.Spec.RenewTime.Time; r.now().After(renewed.Add(duration + leaseSlack)) {
		return reportsState{why: fmt.Sprintf("Kyverno's reports controller is not running (its Lease %s was last renewed at %s)", where, renewed.UTC().Format(time.RFC3339))}
	}
	return reportsState{readable: true}
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
func (r *reports) indexReports(ctx context.Context) error {
	r.indexOnce.Do(func() {
		r.indexErr = r.cache.IndexField(ctx, newPolicyReport(), indexReportPolicies, func(o client.Object) []string {
			return intent.ReportPolicies(o.(*unstructured.Unstructured), false)
		})
	})
	return r.indexErr
}
