package intents

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/go-logr/logr"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/exceptions"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// +kubebuilder:rbac:groups=intent.security.nimbus.com,resources=securityintents;securityintentbindings;clustersecurityintentbindings,verbs=get;list;watch
// +kubebuilder:rbac:groups=intent.security.nimbus.com,resources=securityintents/status;securityintentbindings/status;clustersecurityintentbindings/status;nimbuspolicies/status;clusternimbuspolicies/status,verbs=patch
// +kubebuilder:rbac:groups=intent.security.nimbus.com,resources=nimbuspolicies;clusternimbuspolicies,verbs=get;list;watch;create;update;delete
// Generated objects are owned with blockOwnerDeletion, which needs update on the owners' finalizers.
// +kubebuilder:rbac:groups=intent.security.nimbus.com,resources=securityintentbindings/finalizers;clustersecurityintentbindings/finalizers;nimbuspolicies/finalizers;clusternimbuspolicies/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=namespaces;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=security.kubearmor.com,resources=kubearmorpolicies,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=kyverno.io,resources=policies;clusterpolicies,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Field indexes of the shared cache.
// bindingWorkers is how many times --intents-concurrency bindings are reconciled in parallel.
const bindingWorkers = 4

// base is what the reconcilers share.
type base struct {
	client     client.Client // the manager's, guarded against reading our own writes stale
	apiReader  client.Reader
	namespaces cache.Cache // Namespaces' metadata, a cache of the controller's own
	nodes      cache.Cache // Nodes, a cache of the controller's own (their pod CIDRs)
	// Deployments' metadata, a cache of the controller's own (cocoWorkload's targets).
	deployments cache.Cache
	objects     cache.Cache // the engines' policies, a cache of the controller's own
	recorder    events.EventRecorder
	engines     *cluster.Engines
	deferred    *deferredReports // NimbusPolicies' status reports, after their enforcement
	reports     *cluster.Reports // Kyverno's reports of existing workloads (impact.go)
	now         func() metav1.Time
	log         logr.Logger
}

// step ends every reconcile of an object the controllers report on (status.Step).
func (b *base) step() status.Step { return status.Step{Client: b.client, Recorder: b.recorder} }

// policies writes the engine policies, read from the controller's own cache.
func (b *base) policies() *owned.Writer {
	return &owned.Writer{Client: b.client, Reader: b.objects, APIReader: b.apiReader}
}

// nimbus writes the (Cluster)NimbusPolicies, read from the shared cache.
func (b *base) nimbus() *owned.Writer {
	return &owned.Writer{Client: b.client, Reader: b.client, APIReader: b.apiReader}
}

// reportsPollInterval is how often the reports' state (their reports controller's Lease) is read.
const reportsPollInterval = 10 * time.Second

// Setup registers the intents controllers with the manager; kinds is the manager's follower of
// what is served later (the engines, Kyverno's reports).
func Setup(mgr ctrl.Manager, kinds *controllers.Kinds, o Options) error {
	_, err := setup(mgr, kinds, o, reportsPollInterval)
	return err
}

// setup is Setup with the interval at which the reports' state is read (tests shorten it); it
// returns what the reconcilers share, for tests.
func setup(mgr ctrl.Manager, kinds *controllers.Kinds, o Options, reportsInterval time.Duration) (*base, error) {
	b, err := newBase(mgr, kinds, o, reportsInterval)
	if err != nil {
		return nil, err
	}
	if err := cluster.Index(mgr); err != nil {
		return nil, err
	}
	// The engines and the report kind there now are known before the controllers are built, so
	// their watches are synced before the first reconcile; those that come later start their
	// watches then (Late sources).
	if err := b.engines.Look(context.Background()); err != nil {
		return nil, err
	}
	b.reports.Init(context.Background())
	opts := controller.Options{
		MaxConcurrentReconciles: o.Concurrency,
		RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, 2*time.Minute),
	}
	// A binding's reconcile has one request in flight at a time, a policy's up to policyWriters:
	// with as many workers each, the policies' writes would take most of the API server and the
	// NimbusPolicies would appear only as fast as their engine policies do.
	bindingOpts := opts
	bindingOpts.MaxConcurrentReconciles = o.Concurrency * bindingWorkers
	for _, setup := range []func() error{
		func() error {
			return (&intentReconciler{base: b}).setup(mgr, opts, b.reports.Sources(cluster.Scanned(b.client, nil, ""), b.reportsForIntents))
		},
		func() error {
			return (&bindingReconciler{base: b}).setup(mgr, bindingOpts,
				b.reports.Sources(cluster.Scanned(b.client, &intentv1alpha1.SecurityIntentBindingList{}, cluster.IndexIntents), b.reportsForBindings))
		},
		func() error {
			return (&clusterBindingReconciler{base: b}).setup(mgr, bindingOpts,
				b.reports.Sources(cluster.Scanned(b.client, &intentv1alpha1.ClusterSecurityIntentBindingList{}, cluster.IndexIntents), b.reportsForClusterBindings))
		},
		func() error { return exceptions.Setup(mgr, opts, b.engines, b.reports, o.Exceptions) },
		func() error { return (&policyReconciler{base: b}).setup(mgr, opts) },
		func() error { return (&clusterPolicyReconciler{base: b}).setup(mgr, opts) },
	} {
		if err := setup(); err != nil {
			return nil, err
		}
	}
	if err := mgr.Add(b.reports); err != nil {
		return nil, err
	}
	return b, nil
}

// newBase makes what the reconcilers share: the status-guarded client, the caches of the
// controller's own, the engines and the reports.
func newBase(mgr ctrl.Manager, kinds *controllers.Kinds, o Options, reportsInterval time.Duration) (*base, error) {
	if _, _, err := mgr.GetScheme().ObjectKinds(&intentv1alpha1.NimbusPolicy{}); err != nil {
		return nil, errors.New("the manager's scheme lacks intent.security.nimbus.com/v1alpha1 (add intentv1alpha1.AddToScheme)")
	}
	if _, _, err := mgr.GetScheme().ObjectKinds(&securityv1alpha1.SecurityIntentException{}); err != nil {
		return nil, errors.New("the manager's scheme lacks security.quartermaster.dev/v1alpha1 (add securityv1alpha1.AddToScheme)")
	}
	for kind, list := range map[string]client.ObjectList{
		"SecurityIntent": &intentv1alpha1.SecurityIntentList{}, "SecurityIntentBinding": &intentv1alpha1.SecurityIntentBindingList{},
		"ClusterSecurityIntentBinding": &intentv1alpha1.ClusterSecurityIntentBindingList{},
		"NimbusPolicy":                 &intentv1alpha1.NimbusPolicyList{}, "ClusterNimbusPolicy": &intentv1alpha1.ClusterNimbusPolicyList{},
	} {
		status.CountObjects(mgr, kind, list, status.ConditionState)
	}
	b := &base{
		client: status.NewClient(owned.WithFieldOwner(mgr.GetClient()),
			&intentv1alpha1.SecurityIntent{}, &intentv1alpha1.SecurityIntentBinding{}, &intentv1alpha1.ClusterSecurityIntentBinding{},
			&intentv1alpha1.NimbusPolicy{}, &intentv1alpha1.ClusterNimbusPolicy{}),
		apiReader: mgr.GetAPIReader(),
		recorder:  status.NewRecorder(mgr, "quartermaster-intents"),
		deferred:  newDeferredReports(),
		now:       metav1.Now,
	}
	// Caches of the controller's own: the shared cache may be narrowed to another controller's
	// Namespaces and NetworkPolicies (the namespaces controller's labels).
	for _, c := range []*cache.Cache{&b.namespaces, &b.nodes, &b.deployments, &b.objects} {
		own, err := newCache(mgr)
		if err != nil {
			return nil, err
		}
		*c = own
	}
	allowed, err := o.engines()
	if err != nil {
		return nil, err
	}
	b.log = mgr.GetLogger().WithName("intents")
	b.engines = cluster.NewEngines(kinds, mgr.GetAPIReader(), b.objects, b.log, allowed)
	kyvernoNamespace := o.KyvernoNamespace
	if kyvernoNamespace == "" {
		kyvernoNamespace = "kyverno"
	}
	b.reports, err = cluster.NewReports(mgr, b.engines, b.objects, kyvernoNamespace, reportsInterval)
	return b, err
}

func newCache(mgr ctrl.Manager) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultTransform: cachemeta.Transform,
		ByObject: map[client.Object]cache.ByObject{
			// Of a Node only its pod range is read: its status (images, conditions) is most of its size.
			&corev1.Node{}: {Transform: nodeSpecOnly},
			// assessTLS's objects, the only ConfigMaps and CronJobs generated, are in K8TLS's
			// namespace: no other is cached (nor may the manager list them).
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{intent.K8TLSNamespace: {}}},
			&batchv1.CronJob{}:  {Namespaces: map[string]cache.Config{intent.K8TLSNamespace: {}}},
		},
	})
	if err != nil {
		return nil, err
	}
	return c, controllers.AddCache(mgr, c)
}

func nodeSpecOnly(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.Status = corev1.NodeStatus{}
		n.ManagedFields = nil
	}
	return obj, nil
}

func namespaceMetadata() *metav1.PartialObjectMetadata {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return ns
}

func deploymentMetadata() *metav1.PartialObjectMetadata {
	d := &metav1.PartialObjectMetadata{}
	d.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("Deployment"))
	return d
}

func deploymentMetadataList() *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("DeploymentList"))
	return l
}

func namespaceMetadataList() *metav1.PartialObjectMetadataList {
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
	return l
}
