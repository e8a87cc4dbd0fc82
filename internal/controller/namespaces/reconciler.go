package namespaces

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// RBAC: request ConfigMaps and credential Secrets live in the requests namespace only, so those
// rules are a Role there (config/rbac binds it); if you change --requests-namespace, move the Role.
// delete is never used: the requests and their Secrets are owned by their Namespace (deleting it
// deletes them), and where the OwnerReferencesPermissionEnforcement admission plugin runs (real
// clusters; kwok's API server does not) only who may delete an object may set its ownerReferences.
// +kubebuilder:rbac:groups="",namespace=namespace-requests,resources=configmaps,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=namespace-requests,resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=serviceaccounts/token,verbs=create
// +kubebuilder:rbac:groups="",resources=resourcequotas;limitranges,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update;patch;delete
// Binding tenants to the built-in "admin" ClusterRole needs bind on it, not its permissions.
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=admin,verbs=bind

// Reconciler serves namespace requests.
type Reconciler struct {
	Client    client.Client
	APIReader client.Reader // for objects the cache does not hold (namespaces not labelled as ours)
	Recorder  events.EventRecorder
	Policy    *nsrequest.Policy
	Defaults  *nsrequest.Defaults
	Server    string
	CAData    []byte
	// ServerSource says where Server came from, for the status message.
	ServerSource serverSource
	Now          func() time.Time
	// RestConfig is the manager's connection to the API server; the copies are written through it
	// with the namespace's admin token instead of the manager's credentials (copies.go).
	RestConfig *rest.Config
}

// NewReconciler builds the reconciler; server and caFile override the manager's own API server URL
// and CA in handed-out kubeconfigs.
//
// Without --cluster-server, kubeconfigs name the API server the cluster publishes in
// kube-public/cluster-info (with its CA, unless --cluster-ca-file is given), and only when there
// is none the address the manager itself uses: in a Pod that is the in-cluster Service address,
// which a pipeline outside the cluster cannot reach.
func NewReconciler(mgr ctrl.Manager, policy *nsrequest.Policy, defaults *nsrequest.Defaults, server, caFile string) (*Reconciler, error) {
	cfg := mgr.GetConfig()
	ca, publishedCAUsed := cfg.CAData, false
	source := fromFlag
	if server == "" {
		published, publishedCA, why, err := publishedCluster(context.Background(), mgr.GetAPIReader())
		if err != nil {
			return nil, err
		}
		if published != "" {
			server, source = published, fromClusterInfo
			if len(publishedCA) > 0 {
				ca, publishedCAUsed = publishedCA, true
			}
		} else {
			server, source = cfg.Host, fromManager
			mgr.GetLogger().WithName(Name).Info("kubeconfigs name the manager's own API server address", "server", server, "why", why)
		}
	}
	if caFile == "" && !publishedCAUsed {
		caFile = cfg.CAFile
	}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("reading the cluster CA: %w", err)
		}
		ca = b
	}
	return &Reconciler{
		// The request's annotations, the Secret's token times and the Namespace's annotations
		// drive writes, Events and token minting: never read one older than our last write of it.
		// Every write is the operator's (owned.WithFieldOwner), so the drift rule tells it from others'.
		Client:       status.NewClient(owned.WithFieldOwner(mgr.GetClient()), &corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Namespace{}),
		APIReader:    mgr.GetAPIReader(),
		Recorder:     status.NewRecorder(mgr, "quartermaster-namespaces"),
		Policy:       policy,
		Defaults:     defaults,
		Server:       server,
		CAData:       ca,
		ServerSource: source,
		RestConfig:   cfg,
		Now:          time.Now,
	}, nil
}

// SetupWithManager watches request ConfigMaps and everything made for them.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, concurrency int) error {
	status.CountObjects(mgr, "NamespaceRequest", &corev1.ConfigMapList{}, requestState, client.InNamespace(r.Policy.RequestsNamespace))
	toRequest := handler.EnqueueRequestsFromMapFunc(r.mapToRequest)
	// Objects made for a request wake it when someone changes or deletes them. Their creation does
	// not: the controller made them (one reconcile per request instead of one per object), and at
	// start-up every request is reconciled anyway. Neither does an update that changes nothing the
	// cache keeps (a quota's usage, which the cache drops).
	isOurs := predicate.And(predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[nsrequest.LabelManagedBy] == nsrequest.ManagedByValue
	}), predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool { return contentChanged(e.ObjectOld, e.ObjectNew) },
	})
	b := builder.ControllerManagedBy(mgr).
		Named(Name).
		For(&corev1.ConfigMap{}, builder.WithPredicates(requestPredicate(r.Policy.RequestsNamespace))).
		Watches(&corev1.Namespace{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&corev1.Secret{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&corev1.ServiceAccount{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&rbacv1.Role{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&rbacv1.RoleBinding{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&corev1.ResourceQuota{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&corev1.LimitRange{}, toRequest, builder.WithPredicates(isOurs)).
		Watches(&networkingv1.NetworkPolicy{}, toRequest, builder.WithPredicates(isOurs))
	if r.Policy.CopyFrom != "" {
		// A source of the copies changes: every request gets it again.
		toAll := handler.EnqueueRequestsFromMapFunc(r.requestsOfCopySources)
		isSource := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == r.Policy.CopyFrom })
		b = b.Watches(&corev1.Secret{}, toAll, builder.WithPredicates(isSource)).
			Watches(&corev1.ConfigMap{}, toAll, builder.WithPredicates(isSource))
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(r)
}

// contentChanged reports whether two versions of an object differ in more than their
// resourceVersion.
func contentChanged(before, after client.Object) bool {
	sameVersion := after.DeepCopyObject().(client.Object)
	sameVersion.SetResourceVersion(before.GetResourceVersion())
	return !equality.Semantic.DeepEqual(before, sameVersion)
}

// mapToRequest maps an object made for a request back to the request ConfigMap: a Namespace by its
// name, a Secret (in the requests namespace) by its name, anything else by its namespace.
func (r *Reconciler) mapToRequest(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetNamespace()
	switch o.(type) {
	case *corev1.Namespace:
		name = o.GetName()
	case *corev1.Secret:
		if o.GetNamespace() != r.Policy.RequestsNamespace {
			return nil
		}
		name = o.GetName()
	}
	if !nsrequest.IsOurs(o.GetLabels(), r.Policy.RequestsNamespace, name) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: r.Policy.RequestsNamespace, Name: name}}}
}

// requestPredicate passes request ConfigMaps, and updates to them only when the user changed
// something: the controller's own status annotations and ownerReference do not trigger a reconcile.
func requestPredicate(requestsNamespace string) predicate.Predicate {
	isRequest := func(o client.Object) bool {
		return o.GetNamespace() == requestsNamespace && o.GetName() != nsrequest.RootCAConfigMap &&
			o.GetLabels()[nsrequest.LabelIgnore] != "true"
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return isRequest(e.Object) },
		DeleteFunc:  func(event.DeleteEvent) bool { return false }, // deleting a request leaves its namespace alone
		GenericFunc: func(e event.GenericEvent) bool { return isRequest(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !isRequest(e.ObjectNew) && !isRequest(e.ObjectOld) {
				return false
			}
			o, n := e.ObjectOld.(*corev1.ConfigMap), e.ObjectNew.(*corev1.ConfigMap)
			return !maps.Equal(o.Data, n.Data) || !maps.Equal(o.Labels, n.Labels) ||
				len(o.BinaryData) != len(n.BinaryData) ||
				o.Annotations[nsrequest.AnnotationStatus] != n.Annotations[nsrequest.AnnotationStatus] && n.Annotations[nsrequest.AnnotationStatus] == ""
		},
	}
}

// conflictRetry is how often a request refused for a conflict is looked at again: the object in
// the way is not ours, so no watch tells when it goes.
const conflictRetry = 5 * time.Minute

// outcome is what one reconcile concluded: the status to show, and why.
type outcome struct {
	status  nsrequest.Status
	reason  string
	message string
	requeue time.Duration
	// owner is the request's namespace once it exists and is the request's: the status write
	// makes it the request's owner (one patch with the status).
	owner *corev1.Namespace
	// err is the transient error a Pending "Error" outcome shows (counted when announced).
	err error
}

// Reconcile serves one request ConfigMap.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cm := &corev1.ConfigMap{}
	if err := r.Client.Get(ctx, req.NamespacedName, cm); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// The request is gone but a namespace it created may remain: its ttl still holds.
		return r.expireOrphan(ctx, req.Name)
	}
	if cm.Namespace != r.Policy.RequestsNamespace || cm.Name == nsrequest.RootCAConfigMap ||
		cm.Labels[nsrequest.LabelIgnore] == "true" || cm.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	out, err := r.serve(ctx, cm)
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || errors.Is(err, errCacheBehind) {
		// The cache is behind a write of our own: look again shortly, nothing to report.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		// Transient (refusals are outcomes, not errors): show Pending with the cause, and let the
		// workqueue back off.
		out = outcome{status: nsrequest.StatusPending, reason: "Error", message: err.Error(), owner: out.owner, err: err}
		if werr := r.writeStatus(ctx, cm, out); werr != nil {
			logf.FromContext(ctx).Error(werr, "writing the request status")
		}
		return reconcile.Result{}, err
	}
	if err := r.writeStatus(ctx, cm, out); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: out.requeue}, nil
}

// serve does the work of a request and returns the outcome to show.
func (r *Reconciler) serve(ctx context.Context, cm *corev1.ConfigMap) (outcome, error) {
	req, rej := r.Policy.Parse(cm.Name, cm.Data)
	if rej == nil {
		var err error
		if req.Profile, err = r.Defaults.ProfileNamed(cm.Annotations[nsrequest.AnnotationDefaults]); err != nil {
			// The exchange refuses a profile the defaults lack; this one went from the file since.
			rej = &nsrequest.Rejection{Reason: ReasonUnknownDefaults, Message: err.Error() + ", which the request's " + nsrequest.AnnotationDefaults + " annotation names: the operator's defaults file must define it"}
		}
	}
	if rej != nil {
		out := outcome{status: nsrequest.StatusInvalid, reason: rej.Reason, message: rej.Message}
		// A ttl granted before the request became invalid (edited data, new operator policy) still holds.
		if uid := servedNamespaceUID(cm); uid != "" {
			ns := &corev1.Namespace{}
			if err := r.Client.Get(ctx, client.ObjectKey{Name: cm.Name}, ns); err == nil && ns.UID == uid {
				_, in, err := r.enforceExpiry(ctx, ns)
				out.requeue, out.owner = in, ns
				return out, err
			}
		}
		return out, nil
	}
	// Refuse before creating anything when the Secret name is taken by someone else.
	if out, err := r.checkSecretFree(ctx, req.Namespace); err != nil || out != nil {
		if err != nil {
			return outcome{}, err
		}
		return *out, nil
	}
	ns, out, err := r.ensureNamespace(ctx, cm, req)
	if ns == nil || err != nil {
		return out, err
	}
	out, err = r.serveIn(ctx, req, ns)
	out.owner = ns
	return out, err
}

// serveIn does the work of a request whose namespace exists and is the request's.
func (r *Reconciler) serveIn(ctx context.Context, req *nsrequest.Request, ns *corev1.Namespace) (outcome, error) {
	now := r.Now()
	var expires time.Time
	if req.TTL > 0 {
		expires = ns.CreationTimestamp.Add(req.TTL)
	}
	if err := r.annotateExpiry(ctx, ns, expires); err != nil {
		return outcome{}, err
	}
	if expired, _, err := r.enforceExpiry(ctx, ns); expired || err != nil {
		return expiredOutcome(ns, expires), err
	}
	secret, out, err := r.ensureContents(ctx, req, ns)
	if secret == nil || err != nil {
		return out, err
	}
	if err := r.ensureCopies(ctx, req, secret); err != nil {
		var waiting *errCopySource
		if errors.As(err, &waiting) {
			// Woken when a source appears or changes (requestsOfCopySources); looked at again anyway.
			return outcome{status: nsrequest.StatusPending, reason: ReasonCopySource, message: waiting.msg, requeue: time.Minute}, nil
		}
		return outcome{}, err
	}

	state := tokenState(secret)
	msg := fmt.Sprintf("namespace %s is ready; credentials in Secret %s/%s expire at %s; the kubeconfig names API server %s (%s)",
		req.Namespace, secret.Namespace, secret.Name, state.ExpiresAt.UTC().Format(time.RFC3339), r.Server, r.ServerSource)
	requeue := state.RefreshAt(nsrequest.Jitter(req.Namespace)).Sub(now)
	if !expires.IsZero() {
		msg += "; the namespace is deleted at " + expires.UTC().Format(time.RFC3339)
		requeue = min(requeue, expires.Sub(now))
	}
	for _, n := range req.Notes {
		msg += "; " + n
	}
	return outcome{status: nsrequest.StatusReady, reason: "Ready", message: msg, requeue: max(requeue, time.Second)}, nil
}

// ensureContents makes everything the request gets once its namespace exists, concurrently. The
// objects are independent of each other except for three orderings: the token needs the
// ServiceAccount, the Secret needs the token, and a RoleBinding to a Role of the namespace needs
// that Role (the API server checks a binding's permissions against the Role's rules: for anyone
// but an administrator, binding a Role that does not exist yet is refused). It returns the
// credentials Secret, or nil with an outcome when the request cannot proceed.
func (r *Reconciler) ensureContents(ctx context.Context, req *nsrequest.Request, ns *corev1.Namespace) (*corev1.Secret, outcome, error) {
	var (
		secret *corev1.Secret
		out    outcome
	)
	var first []client.Object                  // made at once
	bindingsOf := map[string][]client.Object{} // made after the Role they refer to, by name
	for _, obj := range nsrequest.NamespaceObjects(r.Policy.RequestsNamespace, req.Namespace, req.Profile) {
		if rb, ok := obj.(*rbacv1.RoleBinding); ok && rb.RoleRef.Kind == "Role" {
			bindingsOf[rb.RoleRef.Name] = append(bindingsOf[rb.RoleRef.Name], rb)
		} else {
			first = append(first, obj)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, want := range first {
		g.Go(func() error {
			got, err := r.ensureObject(gctx, want)
			if err != nil {
				return err
			}
			switch o := got.(type) {
			case *corev1.ServiceAccount:
				secret, out, err = r.ensureCredentials(gctx, req, ns, o)
				return err
			case *rbacv1.Role:
				for _, rb := range bindingsOf[o.Name] {
					if _, err := r.ensureObject(gctx, rb); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	g.Go(func() error { return r.removeUnwantedDefaults(gctx, req) })
	return secret, out, g.Wait()
}

// ensureNamespace returns the request's namespace, creating it when missing, and makes it the
// owner of the request. A nil namespace with an outcome means the request cannot proceed.
//
// Labels alone prove nothing (whoever may create namespaces can set them), so an existing
// namespace is the request's only when it was made for this very ConfigMap (its request-uid
// annotation, or the request's ownerReference), or when the operator's own Secret for the request
// is owned by it (a re-created ConfigMap resumes a namespace served before).
//
// When the namespace that served this request is gone, the request is over: garbage collection is
// about to delete it, and creating the namespace again would leave an orphan behind.
func (r *Reconciler) ensureNamespace(ctx context.Context, cm *corev1.ConfigMap, req *nsrequest.Request) (*corev1.Namespace, outcome, error) {
	rns := r.Policy.RequestsNamespace
	servedUID := servedNamespaceUID(cm)
	ns := &corev1.Namespace{}
	err := r.Client.Get(ctx, client.ObjectKey{Name: req.Namespace}, ns)
	if servedUID != "" && (apierrors.IsNotFound(err) || err == nil && ns.UID != servedUID) {
		return nil, outcome{status: nsrequest.StatusPending, reason: "NamespaceDeleted",
			message: fmt.Sprintf("namespace %s was deleted; this request is deleted with it (re-create the ConfigMap to ask again)", req.Namespace)}, nil
	}
	created := false
	switch {
	case apierrors.IsNotFound(err):
		// The cache holds only namespaces labelled as ours; an unlabelled one shows up as AlreadyExists.
		ns = nsrequest.Namespace(rns, req, cm.UID, r.Now())
		err = r.Client.Create(ctx, ns)
		if apierrors.IsAlreadyExists(err) {
			ns = &corev1.Namespace{}
			err = r.APIReader.Get(ctx, client.ObjectKey{Name: req.Namespace}, ns)
		} else if err == nil {
			created = true
		}
		if err != nil {
			return nil, outcome{}, err
		}
	case err != nil:
		return nil, outcome{}, err
	}
	conflict := outcome{status: nsrequest.StatusConflict, reason: "NamespaceConflict", requeue: conflictRetry,
		message: fmt.Sprintf("namespace %s already exists and was not created by Quartermaster for this request; no credentials are issued for it", req.Namespace)}
	if !nsrequest.IsOurs(ns.Labels, rns, req.Namespace) {
		return nil, conflict, nil
	}
	if !created && ns.UID != servedUID && ns.Annotations[nsrequest.AnnotationRequestUID] != string(cm.UID) {
		owned, err := r.secretOwnedBy(ctx, req.Namespace, ns.UID)
		if err != nil || !owned {
			return nil, conflict, err
		}
		// Resuming: record the new request so the next reconcile needs no proof.
		patch := client.MergeFrom(ns.DeepCopy())
		metav1.SetMetaDataAnnotation(&ns.ObjectMeta, nsrequest.AnnotationRequestUID, string(cm.UID))
		if err := r.Client.Patch(ctx, ns, patch); err != nil {
			return nil, outcome{}, err
		}
	}
	if ns.DeletionTimestamp != nil {
		if exp := expiresAt(ns); !exp.IsZero() && !r.Now().Before(exp) {
			return nil, expiredOutcome(ns, exp), nil
		}
		return nil, outcome{status: nsrequest.StatusPending, reason: "NamespaceTerminating",
			message: fmt.Sprintf("namespace %s is being deleted", req.Namespace)}, nil
	}
	// The request's status write makes the namespace its owner (writeStatus): until then, the
	// namespace's request-uid annotation says whose it is.
	return ns, outcome{}, nil
}

// secretOwnedBy reports whether the operator's credentials Secret for a request is owned by the
// namespace with the given UID.
func (r *Reconciler) secretOwnedBy(ctx context.Context, name string, uid types.UID) (bool, error) {
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Policy.RequestsNamespace, Name: name}, s)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !nsrequest.IsOurs(s.Labels, r.Policy.RequestsNamespace, name) {
		return false, nil
	}
	for _, ref := range s.OwnerReferences {
		if ref.Kind == "Namespace" && ref.UID == uid {
			return true, nil
		}
	}
	return false, nil
}

// servedNamespaceUID returns the UID of the Namespace that owns the request, or "".
func servedNamespaceUID(cm *corev1.ConfigMap) types.UID {
	for _, ref := range cm.OwnerReferences {
		if ref.Kind == "Namespace" && ref.APIVersion == "v1" && ref.Name == cm.Name {
			return ref.UID
		}
	}
	return ""
}

// expiresAt reads a namespace's expires-at annotation; zero when it has none.
func expiresAt(ns *corev1.Namespace) time.Time {
	t, _ := time.Parse(time.RFC3339, ns.Annotations[nsrequest.AnnotationExpiresAt])
	return t
}

// enforceExpiry deletes a namespace whose expires-at annotation has passed. Otherwise it returns
// how long until it does (zero when the namespace has no expiry).
func (r *Reconciler) enforceExpiry(ctx context.Context, ns *corev1.Namespace) (bool, time.Duration, error) {
	exp := expiresAt(ns)
	if exp.IsZero() || ns.DeletionTimestamp != nil {
		return false, 0, nil
	}
	if left := exp.Sub(r.Now()); left > 0 {
		return false, left, nil
	}
	err := r.Client.Delete(ctx, ns, client.Preconditions{UID: &ns.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return false, 0, err
	}
	r.Recorder.Eventf(ns, nil, corev1.EventTypeNormal, "Expired", "Delete", "ttl passed at %s; namespace deleted", exp.UTC().Format(time.RFC3339))
	return true, 0, nil
}

// expireOrphan enforces the ttl of a namespace whose request ConfigMap was deleted.
func (r *Reconciler) expireOrphan(ctx context.Context, name string) (reconcile.Result, error) {
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !nsrequest.IsOurs(ns.Labels, r.Policy.RequestsNamespace, name) {
		return reconcile.Result{}, nil
	}
	_, in, err := r.enforceExpiry(ctx, ns)
	return reconcile.Result{RequeueAfter: in}, err
}

func expiredOutcome(ns *corev1.Namespace, exp time.Time) outcome {
	return outcome{status: nsrequest.StatusPending, reason: "Expired",
		message: fmt.Sprintf("the ttl of namespace %s passed at %s; it is being deleted", ns.Name, exp.UTC().Format(time.RFC3339))}
}

// annotateExpiry keeps the namespace's expires-at annotation true to the request's ttl.
func (r *Reconciler) annotateExpiry(ctx context.Context, ns *corev1.Namespace, expires time.Time) error {
	want := ""
	if !expires.IsZero() {
		want = expires.UTC().Format(time.RFC3339)
	}
	// The annotation set at creation used the operator's clock; a difference of under a minute from
	// the server's creation time is not worth a write.
	if got := expiresAt(ns); ns.Annotations[nsrequest.AnnotationExpiresAt] == want ||
		!expires.IsZero() && !got.IsZero() && got.Sub(expires).Abs() < time.Minute {
		return nil
	}
	patch := client.MergeFrom(ns.DeepCopy())
	if want == "" {
		delete(ns.Annotations, nsrequest.AnnotationExpiresAt)
	} else {
		if ns.Annotations == nil {
			ns.Annotations = map[string]string{}
		}
		ns.Annotations[nsrequest.AnnotationExpiresAt] = want
	}
	return r.Client.Patch(ctx, ns, patch)
}

// removeUnwantedDefaults deletes the defaults the request's profile no longer has from the
// namespace: removed from the operator's configuration, they are removed from the namespaces too.
func (r *Reconciler) removeUnwantedDefaults(ctx context.Context, req *nsrequest.Request) error {
	name := req.Namespace
	for _, obj := range []client.Object{&corev1.ResourceQuota{}, &corev1.LimitRange{}, &networkingv1.NetworkPolicy{}} {
		if wanted(obj, req.Profile) {
			continue
		}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: name, Name: nsrequest.DefaultsObjectsName}, obj)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if nsrequest.IsOurs(obj.GetLabels(), r.Policy.RequestsNamespace, name) {
			if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

func wanted(obj client.Object, d *nsrequest.Profile) bool {
	switch obj.(type) {
	case *corev1.ResourceQuota:
		return d.ResourceQuota != nil
	case *corev1.LimitRange:
		return d.LimitRange != nil
	case *networkingv1.NetworkPolicy:
		return d.IsolateNetwork
	}
	return false
}

// ensureObject brings an object made inside the request's namespace to want through the one path
// for owned objects (owned.Writer: drift is another writer's edit or a changed want, never a
// defaulted field; others' labels and annotations stay). The objects have no controller: the
// namespace, checked to be the request's, is the claim (inTheRequestsNamespace). A RoleBinding whose roleRef changed is
// deleted and created again (the API server does not update a roleRef). It returns the object as
// stored.
func (r *Reconciler) ensureObject(ctx context.Context, want client.Object) (client.Object, error) {
	w := owned.Writer{Client: r.Client, Reader: r.Client, APIReader: r.APIReader}
	did, got, err := w.Ensure(ctx, want, owned.Options{Claims: inTheRequestsNamespace, Recreate: roleRefChanged, Prepare: dropRequestAnnotation})
	if err != nil {
		return nil, err
	}
	if did == owned.Terminating {
		return nil, fmt.Errorf("namespace %s is being deleted", want.GetNamespace())
	}
	return got, nil
}

// inTheRequestsNamespace: every object in a namespace made for a request is the request's (an
// object of that name made there without our labels is adopted).
func inTheRequestsNamespace(client.Object) bool { return true }

// dropRequestAnnotation: releases before 2026-11-27 annotated every object made in a requested
// namespace with the request (the Namespace alone carries it now); the first update takes it
// off, so that the object's annotations are its drift hash alone, one shared copy in the cache.
func dropRequestAnnotation(update, _ client.Object) {
	if a := update.GetAnnotations(); a[nsrequest.AnnotationRequest] != "" {
		delete(a, nsrequest.AnnotationRequest) // Ensure's own copy (owned.Merged)
	}
}

// roleRefChanged: a RoleBinding's roleRef cannot be updated.
func roleRefChanged(desired, current client.Object) bool {
	d, ok := desired.(*rbacv1.RoleBinding)
	return ok && d.RoleRef != current.(*rbacv1.RoleBinding).RoleRef
}

// writeStatus records the outcome on the request ConfigMap (status, reason and message
// annotations) through the status step (Step.WriteAnnotations: one patch, only when it changed,
// an Event when the reason changes, not when only the message does: a token rotation has its own
// Event on the Secret).
func (r *Reconciler) writeStatus(ctx context.Context, cm *corev1.ConfigMap, out outcome) error {
	want := cm.DeepCopy()
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[nsrequest.AnnotationStatus] = string(out.status)
	want.Annotations[nsrequest.AnnotationReason] = out.reason
	want.Annotations[nsrequest.AnnotationMessage] = out.message
	// From here on, deleting the namespace deletes the request, and the controller knows the
	// request was served.
	if out.owner != nil && servedNamespaceUID(cm) != out.owner.UID {
		if err := controllerutil.SetOwnerReference(out.owner, want, r.Client.Scheme()); err != nil {
			return err
		}
	}
	step := status.Step{Client: r.Client, Recorder: r.Recorder}
	return step.WriteAnnotations(ctx, cm, want, cm.Annotations[nsrequest.AnnotationReason], out.report())
}

// report is the outcome in the terms every controller reports in: Invalid and Conflict wait for a
// person; a namespace going away (at its ttl, or deleted) is an expected state, told as Normal.
func (o outcome) report() status.Outcome {
	r := status.Outcome{
		Ready: o.status == nsrequest.StatusReady, Reason: o.reason, Message: o.message, Err: o.err,
		Stalled: o.status == nsrequest.StatusInvalid || o.status == nsrequest.StatusConflict,
	}
	if o.status == nsrequest.StatusPending && o.reason != "Error" {
		r.EventType = corev1.EventTypeNormal
	}
	return r
}
