package intents

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// enginePollInterval is how often discovery is asked which engines are installed.
const enginePollInterval = 10 * time.Second

// engines knows which policy engines the cluster has, by their kinds being served, and tells
// when one appears (its CRDs installed late) so its policies are generated then.
type engines struct {
	discovery discovery.DiscoveryInterface
	reader    client.Reader // reads K8TLS's ServiceAccount, uncached
	interval  time.Duration
	log       logr.Logger
	// appeared is called, once per engine, when it is first seen (wake: reconcile every policy,
	// false before the controllers have started and reconcile everything anyway).
	appeared func(ctx context.Context, e intent.Engine, wake bool) error

	forbiddenOnce sync.Once

	// allowed are the engines --intents-engines enables (nil: every engine). Another is neither
	// looked for, watched nor written, and its objects are left as they are.
	allowed map[intent.Engine]bool

	mu      sync.RWMutex
	present map[intent.Engine]bool
}

// enabled reports whether --intents-engines lets the controller use the engine.
func (e *engines) enabled(en intent.Engine) bool {
	return e.allowed == nil || e.allowed[en]
}

// available reports whether the engine is enabled and installed: its policies are written.
func (e *engines) available(en intent.Engine) bool {
	return e.enabled(en) && e.has(en)
}

// has reports whether the engine's kinds are served (NetworkPolicy always is).
func (e *engines) has(en intent.Engine) bool {
	if en == intent.NetworkPolicy {
		return true
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.present[en]
}

// NeedLeaderElection is false: the watches it adds belong to leader-elected controllers.
func (e *engines) NeedLeaderElection() bool { return false }

// Start polls discovery until ctx ends.
func (e *engines) Start(ctx context.Context) error {
	wait.UntilWithContext(ctx, func(ctx context.Context) { e.detect(ctx) }, e.interval)
	return nil
}

// detect looks for engines installed since, and marks each present before its watches and the
// wake-up of every policy, so a policy reconciled for the new engine sees it.
func (e *engines) detect(ctx context.Context) {
	for _, en := range e.markServed(ctx) {
		e.watch(ctx, en, true)
	}
}

// markServed marks present, and returns, the engines not present yet whose kinds discovery
// serves now (K8TLS: whose namespace and ServiceAccount exist).
func (e *engines) markServed(ctx context.Context) []intent.Engine {
	var out []intent.Engine
	for _, en := range []intent.Engine{intent.KubeArmor, intent.Kyverno, intent.K8TLS} {
		if e.has(en) || !e.enabled(en) {
			continue
		}
		var served bool
		var err error
		if en == intent.K8TLS {
			served, err = e.k8tlsInstalled(ctx)
		} else {
			served, err = allServed(e.discovery, intent.EngineKinds[en])
		}
		if err != nil {
			e.log.Error(err, "asking discovery for a policy engine's kinds; retrying", "engine", en)
			continue
		}
		if served {
			e.setPresent(en, true)
			out = append(out, en)
		}
	}
	return out
}

// watch adds the engine's watches (wake: and reconciles every policy). One whose watches fail is
// marked absent again, and Start finds it anew (with every policy woken).
func (e *engines) watch(ctx context.Context, en intent.Engine, wake bool) {
	if err := e.appeared(ctx, en, wake); err != nil {
		e.setPresent(en, false)
		e.log.Error(err, "watching a policy engine's kinds; retrying", "engine", en)
		return
	}
	e.log.Info("policy engine installed: generating its policies", "engine", en)
}

func (e *engines) setPresent(en intent.Engine, present bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.present[en] = present
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

func allServed(d discovery.DiscoveryInterface, kinds []schema.GroupVersionKind) (bool, error) {
	for _, gvk := range kinds {
		list, err := d.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Kind == gvk.Kind }) {
			return false, nil
		}
	}
	return true, nil
}
