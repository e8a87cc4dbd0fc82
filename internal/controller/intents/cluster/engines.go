// Package cluster is what the intents controller's parts know of the cluster beyond the API
// objects they reconcile: which policy engines it has (Engines, from the manager's Kinds) and what
// Kyverno's reports say of the generated policies (Reports: a cache of them, and whether they can
// be read). The parts read them and are told of their changes through sources of their own
// controllers; none writes through them.
package cluster

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// Engines knows which policy engines the cluster has, from the manager's Kinds (an engine is
// installed once its kinds are served; K8TLS once its namespace and ServiceAccount exist). An engine
// installed late is watched by the policy controllers' Late sources, which reconcile every policy
// when it appears.
type Engines struct {
	kinds   *controllers.Kinds
	reader  client.Reader // reads K8TLS's ServiceAccount, uncached
	objects cache.Cache   // the engines' policies (indexed by their controller once served)
	log     logr.Logger

	forbiddenOnce sync.Once

	// allowed are the engines --intents-engines enables (nil: every engine). Another is neither
	// looked for, watched nor written, and its objects are left as they are.
	allowed map[intent.Engine]bool
	needs   map[intent.Engine]controllers.Need

	prepared map[intent.Engine]*prepared // engines whose kinds are indexed in objects
}

// prepared is one engine's indexing, done once.
type prepared struct {
	once sync.Once
	err  error
	done atomic.Bool
}

// NewEngines follows the engines allowed (nil: every engine) through kinds; reader reads K8TLS's
// ServiceAccount (uncached), objects is the cache of the engines' policies their kinds are indexed in.
func NewEngines(kinds *controllers.Kinds, reader client.Reader, objects cache.Cache, log logr.Logger, allowed map[intent.Engine]bool) *Engines {
	e := &Engines{kinds: kinds, reader: reader, objects: objects, log: log, allowed: allowed,
		needs: map[intent.Engine]controllers.Need{}, prepared: map[intent.Engine]*prepared{}}
	for _, en := range []intent.Engine{intent.KubeArmor, intent.Kyverno, intent.NetworkPolicy, intent.K8TLS} {
		n := controllers.Need{Name: "policy engine " + string(en), Kinds: intent.EngineKinds[en], Announce: "policy engine installed: generating its policies"}
		switch en {
		case intent.NetworkPolicy:
			n.Announce = "" // built in: always there
		case intent.K8TLS:
			// Its kinds (CronJob, ConfigMap) are built in and say nothing: its namespace and ServiceAccount do.
			n.Kinds, n.Probe = nil, e.k8tlsInstalled
		}
		e.needs[en], e.prepared[en] = n, &prepared{}
	}
	return e
}

// Prepare indexes the engine's kinds in objects by their controller's UID (a reconcile lists its
// owner's policies only), once; the engine counts as installed from then on. Every Late source of
// the engine runs it before it starts (an index cannot be added before its kind is served).
func (e *Engines) Prepare(en intent.Engine) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		p := e.prepared[en]
		p.once.Do(func() {
			for _, gvk := range intent.EngineKinds[en] {
				obj := &unstructured.Unstructured{}
				obj.SetGroupVersionKind(gvk)
				if p.err = e.objects.IndexField(ctx, obj, IndexController, ControllerUID); p.err != nil {
					return
				}
			}
			p.done.Store(true)
		})
		return p.err
	}
}

// Enabled reports whether --intents-engines lets the controller use the engine.
func (e *Engines) Enabled(en intent.Engine) bool {
	return e.allowed == nil || e.allowed[en]
}

// Available reports whether the engine is enabled and installed: its policies are written.
func (e *Engines) Available(en intent.Engine) bool {
	return e.Enabled(en) && e.Has(en)
}

// Has reports whether the engine's kinds are served and indexed.
func (e *Engines) Has(en intent.Engine) bool {
	p := e.prepared[en]
	return p != nil && p.done.Load()
}

// Look asks now for the enabled engines and prepares those installed, so that they are known
// before the controllers are built: their watches are synced before the first reconcile.
func (e *Engines) Look(ctx context.Context) error {
	for en, n := range e.needs {
		if e.Enabled(en) && e.kinds.Check(ctx, n) {
			if err := e.Prepare(en)(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// k8tlsInstalled reports whether nimbus-k8tls's namespace and the ServiceAccount its scans run as
// exist: its kinds (CronJob, ConfigMap) are built in, so they say nothing. Without the optional
// Role of config/rbac/intents-k8tls the manager may not read the ServiceAccount: not installed,
// as far as it can tell, and the log says why once.
func (e *Engines) k8tlsInstalled(ctx context.Context) (bool, error) {
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

// Need is what the engine waits for, as the manager's Kinds knows it.
func (e *Engines) Need(en intent.Engine) controllers.Need { return e.needs[en] }

// Kinds is the manager's follower of what is served later.
func (e *Engines) Kinds() *controllers.Kinds { return e.kinds }

// IndexController indexes NimbusPolicies (in the manager's cache), and the engine policies in the
// controller's objects cache, by their controller's UID.
const IndexController = "metadata.controllerUID"

// ControllerUID is the value of IndexController.
func ControllerUID(o client.Object) []string {
	if ref := metav1.GetControllerOf(o); ref != nil {
		return []string{string(ref.UID)}
	}
	return nil
}

// ControllerNamed is the name of obj's controller when it is of kind in the intent API, "" otherwise.
func ControllerNamed(obj metav1.Object, kind string) string {
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil || ref.Kind != kind || ref.APIVersion != intentv1alpha1.GroupVersion.String() {
		return ""
	}
	return ref.Name
}
