package intents

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// engines knows which policy engines the cluster has, from the manager's Kinds (an engine is
// installed once its kinds are served; K8TLS once its namespace and ServiceAccount exist). An engine
// installed late is watched by the policy controllers' Late sources, which reconcile every policy
// when it appears.
type engines struct {
	kinds   *controllers.Kinds
	reader  client.Reader // reads K8TLS's ServiceAccount, uncached
	objects cache.Cache   // the engines' policies (indexed by their controller once served)
	log     logr.Logger

	forbiddenOnce sync.Once

	// allowed are the engines --intents-engines enables (nil: every engine). Another is neither
	// looked for, watched nor written, and its objects are left as they are.
	allowed map[intent.Engine]bool
	needs   map[intent.Engine]controllers.Need

	mu       sync.Mutex
	prepared map[intent.Engine]*prepared // engines whose kinds are indexed in objects
}

// prepared is one engine's indexing, done once.
type prepared struct {
	once sync.Once
	err  error
	done bool
}

func newEngines(kinds *controllers.Kinds, reader client.Reader, objects cache.Cache, log logr.Logger, allowed map[intent.Engine]bool) *engines {
	e := &engines{kinds: kinds, reader: reader, objects: objects, log: log, allowed: allowed,
		needs: map[intent.Engine]controllers.Need{}, prepared: map[intent.Engine]*prepared{}}
	const installed = "policy engine installed: generating its policies"
	for _, en := range []intent.Engine{intent.KubeArmor, intent.Kyverno, intent.NetworkPolicy, intent.K8TLS} {
		e.needs[en] = controllers.Need{Name: "policy engine " + string(en), Kinds: intent.EngineKinds[en], Announce: installed}
		e.prepared[en] = &prepared{}
	}
	e.needs[intent.NetworkPolicy] = controllers.Need{Name: "policy engine " + string(intent.NetworkPolicy), Kinds: intent.EngineKinds[intent.NetworkPolicy]} // built in
	// Its kinds (CronJob, ConfigMap) are built in and say nothing: its namespace and ServiceAccount do.
	e.needs[intent.K8TLS] = controllers.Need{Name: "policy engine " + string(intent.K8TLS), Probe: e.k8tlsInstalled, Announce: installed}
	return e
}

// prepare indexes the engine's kinds in objects by their controller's UID (a reconcile lists its
// owner's policies only), once; the engine counts as installed from then on. Every Late source of
// the engine runs it before it starts (an index cannot be added before its kind is served).
func (e *engines) prepare(en intent.Engine) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		p := e.prepared[en]
		p.once.Do(func() {
			for _, gvk := range intent.EngineKinds[en] {
				obj := &unstructured.Unstructured{}
				obj.SetGroupVersionKind(gvk)
				if p.err = e.objects.IndexField(ctx, obj, indexController, controllerUID); p.err != nil {
					return
				}
			}
			e.mu.Lock()
			p.done = true
			e.mu.Unlock()
		})
		return p.err
	}
}

// enabled reports whether --intents-engines lets the controller use the engine.
func (e *engines) enabled(en intent.Engine) bool {
	return e.allowed == nil || e.allowed[en]
}

// available reports whether the engine is enabled and installed: its policies are written.
func (e *engines) available(en intent.Engine) bool {
	return e.enabled(en) && e.has(en)
}

// has reports whether the engine's kinds are served and indexed.
func (e *engines) has(en intent.Engine) bool {
	p := e.prepared[en]
	if p == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return p.done
}

// look asks now for the enabled engines and prepares those installed, so that they are known
// before the controllers are built: their watches are synced before the first reconcile.
func (e *engines) look(ctx context.Context) error {
	for en, n := range e.needs {
		if e.enabled(en) && e.kinds.Check(ctx, n) {
			if err := e.prepare(en)(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// sources are the watches of the kinds among kinds that the enabled engines generate, one Late
// source each, for a controller of owner (listed by list): an edit or deletion of a generated
// policy reconciles its owner; creations are the owner's own and wake nothing (the reconcile that
// made an object has looked at it, and an informer's replay at start is of owners reconciled at
// start anyway); an engine that appears after the start reconciles every owner, whose policies
// for it can be made now.
func (b *base) engineSources(mgr ctrl.Manager, kinds []schema.GroupVersionKind, owner client.Object, list client.ObjectList) []source.Source {
	var out []source.Source
	for _, en := range []intent.Engine{intent.KubeArmor, intent.NetworkPolicy, intent.Kyverno, intent.K8TLS} {
		if !b.engines.enabled(en) {
			continue
		}
		woken := false
		for _, gvk := range intent.EngineKinds[en] {
			if !slices.Contains(kinds, gvk) {
				continue
			}
			obj := &unstructured.Unstructured{}
			obj.SetGroupVersionKind(gvk)
			late := b.engines.kinds.Watch(b.engines.needs[en], b.objects, obj,
				handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), owner, handler.OnlyControllerOwner()), notCreated()).
				Prepare(b.engines.prepare(en))
			if !woken {
				late, woken = late.Appeared(b.enqueueAll(list)), true
			}
			out = append(out, late)
		}
	}
	return out
}

// enqueueAll adds every object of list's kind to a controller's queue.
func (b *base) enqueueAll(list client.ObjectList) func(ctx context.Context, q controllers.Queue) {
	return func(ctx context.Context, q controllers.Queue) {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := b.client.List(ctx, l); err != nil {
			b.engines.log.Error(err, "reconciling every object after an engine appeared: listing failed; each is reconciled at its recheck", "kind", fmt.Sprintf("%T", list))
			return
		}
		_ = forEach(l, func(o client.Object) { q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)}) })
	}
}

// k8tlsInstalled reports whether nimbus-k8tls's namespace and the ServiceAccount its scans run as
// exist: its kinds (CronJob, ConfigMap) are built in, so they say nothing. Without the optional
// Role of config/rbac/intents-k8tls the manager may not read the ServiceAccount: not installed,
// as far as it can tell, and the log says why once.
func (e *engines) k8tlsInstalled(ctx context.Context) (bool, error) {
	sa := &corev1.ServiceAccount{}
	err := e.reader.Get(ctx, client.ObjectKey{Namespace: intent.K8TLSNamespace, Name: intent.K8TLSServiceAccount}, sa)
	if err == nil {
		// Its kinds must be listable there too (the Role grants both): a watch that is refused
		// would fail for ever, and a namespace left behind may still hold the ServiceAccount.
		if err = e.reader.List(ctx, &batchv1.CronJobList{}, client.InNamespace(intent.K8TLSNamespace), client.Limit(1)); err == nil {
			err = e.reader.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(intent.K8TLSNamespace), client.Limit(1))
		}
	}
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsForbidden(err):
		e.forbiddenOnce.Do(func() {
			e.log.Info("may not read nimbus-k8tls's ServiceAccount, CronJobs or ConfigMaps: assessTLS stays off until the Role of config/rbac/intents-k8tls is applied",
				"namespace", intent.K8TLSNamespace, "serviceAccount", intent.K8TLSServiceAccount)
		})
		return false, nil
	}
	return false, err
}
