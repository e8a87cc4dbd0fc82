package iam

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	"sigs.k8s.io/yaml"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/owned"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
)

// The compat mode's rules are a ClusterRole of their own, quartermaster-iam-compat, installed only
// with --iam-configmap-compat (the chart's iam.configMapCompat): without it the iam controller reads
// no ConfigMap and never creates or deletes IAM objects.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;patch,roleName=quartermaster-iam-compat
// Owner references with blockOwnerDeletion to a ConfigMap need update on its finalizers where the
// OwnerReferencesPermissionEnforcement admission plugin runs.
// +kubebuilder:rbac:groups="",resources=configmaps/finalizers,verbs=update,roleName=quartermaster-iam-compat
// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iampolicies;iamserviceaccounts,verbs=create;update;delete,roleName=quartermaster-iam-compat

// The legacy ConfigMap: its name, keys, and the annotations its status is written to.
const (
	CompatConfigMap       = "iam-config"
	KeyPolicies           = "policies.yaml"
	KeyAttachments        = "serviceaccount_attachments.yaml"
	AnnotationCompatState = "iam.quartermaster.dev/status"
	AnnotationCompatMsg   = "iam.quartermaster.dev/message"
	// LabelCompat marks the objects translated from a ConfigMap (they are also owned by it).
	LabelCompat = "iam.quartermaster.dev/configmap"
)

// CompatReconciler translates each iam-config ConfigMap into IAMPolicy and IAMServiceAccount
// objects of its namespace, owned by the ConfigMap, and writes their summary back into the
// ConfigMap's annotations.
type CompatReconciler struct {
	*base
	// configMaps reads the ConfigMaps from the controller's own cache, guarded (status.NewClient):
	// never older than its own last status write.
	configMaps client.Client
}

func (r *CompatReconciler) setupWithManager(mgr ctrl.Manager) error {
	// A cache of its own holding only ConfigMaps named iam-config: the shared cache's ConfigMaps
	// may be narrowed to another controller's namespace.
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultTransform: cachemeta.Transform,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Field: fields.OneTermEqualSelector("metadata.name", CompatConfigMap)},
		},
	})
	if err != nil {
		return err
	}
	if err := controllers.AddCache(mgr, c); err != nil {
		return err
	}
	cc, err := client.New(mgr.GetConfig(), client.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		Cache: &client.CacheOptions{Reader: c},
	})
	if err != nil {
		return err
	}
	r.configMaps = status.NewClient(owned.WithFieldOwner(cc), &corev1.ConfigMap{})
	owned := handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &corev1.ConfigMap{}, handler.OnlyControllerOwner())
	return builder.ControllerManagedBy(mgr).
		Named("iam-configmap").
		WatchesRawSource(source.Kind(c, &corev1.ConfigMap{}, &handler.TypedEnqueueRequestForObject[*corev1.ConfigMap]{}, dataChanged())).
		Watches(&iamv1alpha1.IAMPolicy{}, owned, builder.WithPredicates(readyChanged())).
		Watches(&iamv1alpha1.IAMServiceAccount{}, owned, builder.WithPredicates(readyChanged())).
		WithOptions(r.controllerOptions()).
		Complete(r)
}

// dataChanged ignores the controller's own annotation writes.
func dataChanged() predicate.TypedPredicate[*corev1.ConfigMap] {
	return predicate.TypedFuncs[*corev1.ConfigMap]{UpdateFunc: func(e event.TypedUpdateEvent[*corev1.ConfigMap]) bool {
		return !maps.Equal(e.ObjectOld.Data, e.ObjectNew.Data)
	}}
}

// readyChanged passes changes of an object's Ready condition, its creation and its deletion.
func readyChanged() predicate.Predicate {
	return predicate.Or[client.Object](status.ReadyChanged(), predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})
}

// Reconcile translates one ConfigMap.
func (r *CompatReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cm := &corev1.ConfigMap{}
	if err := r.configMaps.Get(ctx, req.NamespacedName, cm); err != nil {
		// Gone: the objects it owns go with it (garbage collection), and with them the AWS objects.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !cm.DeletionTimestamp.IsZero() {
		// Being deleted (foreground deletion, a finalizer): the garbage collector is deleting its
		// objects, which must not be created again.
		return reconcile.Result{}, nil
	}
	policies, accounts, problems := translate(cm)
	var expected map[string]bool
	if len(problems) == 0 {
		var err error
		if expected, problems, err = r.apply(ctx, cm, policies, accounts); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, r.report(ctx, cm, expected, problems)
}

// translate parses the ConfigMap into the objects it stands for; problems make the whole
// ConfigMap invalid, so a half-written file never deletes anything.
func translate(cm *corev1.ConfigMap) (policies []*iamv1alpha1.IAMPolicy, accounts []*iamv1alpha1.IAMServiceAccount, problems []string) {
	// A misspelt or dropped key must not read as "no policies" and delete them all.
	for _, k := range []string{KeyPolicies, KeyAttachments} {
		if _, ok := cm.Data[k]; !ok {
			problems = append(problems, fmt.Sprintf("key %s is missing (write {} for none)", k))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
		if k != KeyPolicies && k != KeyAttachments {
			problems = append(problems, fmt.Sprintf("unknown key %s (want %s and %s)", k, KeyPolicies, KeyAttachments))
		}
	}
	var docs map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data[KeyPolicies]), &docs); err != nil {
		problems = append(problems, KeyPolicies+": "+err.Error())
	}
	var attachments map[string][]string
	if err := yaml.UnmarshalStrict([]byte(cm.Data[KeyAttachments]), &attachments); err != nil {
		problems = append(problems, KeyAttachments+": "+err.Error()+" (want: ServiceAccount name: [policy names])")
	}
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("%s: policy name %q: %s", KeyPolicies, name, strings.Join(errs, "; ")))
			continue
		}
		doc, err := legacyDocument(docs[name])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: policy %q: %v", KeyPolicies, name, err))
			continue
		}
		p := &iamv1alpha1.IAMPolicy{Spec: iamv1alpha1.IAMPolicySpec{Document: doc, Description: "from ConfigMap " + cm.Namespace + "/" + CompatConfigMap}}
		p.Namespace, p.Name = cm.Namespace, name
		policies = append(policies, p)
	}
	for _, sa := range slices.Sorted(maps.Keys(attachments)) {
		if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("%s: ServiceAccount name %q: %s", KeyAttachments, sa, strings.Join(errs, "; ")))
			continue
		}
		names := slices.Sorted(slices.Values(attachments[sa]))
		for _, n := range names {
			if _, ok := docs[n]; !ok {
				problems = append(problems, fmt.Sprintf("%s: %s names policy %q, which %s does not define", KeyAttachments, sa, n, KeyPolicies))
			}
		}
		a := &iamv1alpha1.IAMServiceAccount{Spec: iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: sa, Policies: slices.Compact(names)}}
		a.Namespace, a.Name = cm.Namespace, sa
		accounts = append(accounts, a)
	}
	return policies, accounts, problems
}

// apply creates, updates and deletes the ConfigMap's objects. Objects of the same name that the
// ConfigMap does not own are left alone and reported. expected holds the objects ("Kind/name")
// the ConfigMap now lists, true for those that exist or were created (false: reported).
func (r *CompatReconciler) apply(ctx context.Context, cm *corev1.ConfigMap, policies []*iamv1alpha1.IAMPolicy, accounts []*iamv1alpha1.IAMServiceAccount) (expected map[string]bool, problems []string, err error) {
	want := map[string]bool{}
	expected = map[string]bool{}
	for _, p := range policies {
		want["IAMPolicy/"+p.Name] = true
		problem, err := r.upsert(ctx, cm, p)
		if err != nil {
			return nil, nil, err
		}
		expected["IAMPolicy/"+p.Name] = len(problem) == 0
		problems = append(problems, problem...)
	}
	for _, a := range accounts {
		want["IAMServiceAccount/"+a.Name] = true
		problem, err := r.upsert(ctx, cm, a)
		if err != nil {
			return nil, nil, err
		}
		expected["IAMServiceAccount/"+a.Name] = len(problem) == 0
		problems = append(problems, problem...)
	}
	// Objects the ConfigMap no longer lists go (their finalizers clean up AWS).
	made, err := r.made(ctx, cm)
	if err != nil {
		return nil, nil, err
	}
	for _, obj := range made {
		if want[kindOf(obj)+"/"+obj.GetName()] || !obj.GetDeletionTimestamp().IsZero() {
			continue
		}
		if err := r.client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return nil, nil, err
		}
	}
	return expected, problems, nil
}

// upsert brings the ConfigMap's object obj about through the one path for owned objects
// (owned.Writer): created, repaired when its spec was edited or the ConfigMap changed it, left
// alone (and reported) when the name is held by an object the ConfigMap does not control; a spec
// the API server refuses is reported too.
func (r *CompatReconciler) upsert(ctx context.Context, cm *corev1.ConfigMap, obj client.Object) ([]string, error) {
	kind := kindOf(obj)
	obj.SetLabels(map[string]string{LabelCompat: CompatConfigMap})
	if err := controllerutil.SetControllerReference(cm, obj, r.client.Scheme()); err != nil {
		return nil, err
	}
	w := owned.Writer{Client: r.client, Reader: r.client, APIReader: r.apiReader}
	did, _, err := w.Ensure(ctx, obj, owned.Options{})
	switch {
	case apierrors.IsInvalid(err):
		return []string{fmt.Sprintf("%s %s: %v", kind, obj.GetName(), err)}, nil
	case err != nil:
		return nil, err
	case did == owned.Taken:
		return []string{fmt.Sprintf("%s %s exists and was not created from this ConfigMap; it is left alone", kind, obj.GetName())}, nil
	}
	return nil, nil
}

// made lists the objects of the namespace that this ConfigMap controls.
func (r *CompatReconciler) made(ctx context.Context, cm *corev1.ConfigMap) ([]client.Object, error) {
	sel := client.MatchingLabels{LabelCompat: CompatConfigMap}
	var out []client.Object
	pols := &iamv1alpha1.IAMPolicyList{}
	if err := r.client.List(ctx, pols, client.InNamespace(cm.Namespace), sel); err != nil {
		return nil, err
	}
	for i := range pols.Items {
		if metav1.IsControlledBy(&pols.Items[i], cm) {
			out = append(out, &pols.Items[i])
		}
	}
	sas := &iamv1alpha1.IAMServiceAccountList{}
	if err := r.client.List(ctx, sas, client.InNamespace(cm.Namespace), sel); err != nil {
		return nil, err
	}
	for i := range sas.Items {
		if metav1.IsControlledBy(&sas.Items[i], cm) {
			out = append(out, &sas.Items[i])
		}
	}
	return out, nil
}

func kindOf(obj client.Object) string {
	if _, ok := obj.(*iamv1alpha1.IAMPolicy); ok {
		return "IAMPolicy"
	}
	return "IAMServiceAccount"
}

// report summarizes the ConfigMap's objects into its annotations, with an Event when the state
// changes. States: Ready (every object Ready), Pending, Error (a problem a person must fix).
// expected (nil when the ConfigMap does not translate) are the objects it stands for: the cache
// may not show those just created yet, or still show those just deleted, and neither is Ready.
func (r *CompatReconciler) report(ctx context.Context, cm *corev1.ConfigMap, expected map[string]bool, problems []string) error {
	made, err := r.made(ctx, cm)
	if err != nil {
		return err
	}
	ready, total := 0, len(made)
	var waiting []string
	seen := map[string]bool{}
	for _, obj := range made {
		c := status.ReadyOf(obj)
		key := kindOf(obj) + "/" + obj.GetName()
		seen[key] = true
		switch {
		case expected != nil && !listed(expected, key) && (c == nil || c.Status == metav1.ConditionTrue):
			waiting = append(waiting, kindOf(obj)+" "+obj.GetName()+": being deleted")
		case c != nil && c.Status == metav1.ConditionTrue:
			ready++
		case c != nil && (meta.IsStatusConditionTrue(status.ConditionsOf(obj), iamv1alpha1.ConditionStalled)):
			problems = append(problems, fmt.Sprintf("%s %s: %s: %s", kindOf(obj), obj.GetName(), c.Reason, c.Message))
		case c != nil:
			waiting = append(waiting, fmt.Sprintf("%s %s: %s", kindOf(obj), obj.GetName(), c.Reason))
		default:
			waiting = append(waiting, kindOf(obj)+" "+obj.GetName())
		}
	}
	for _, key := range slices.Sorted(maps.Keys(expected)) {
		if expected[key] && !seen[key] {
			total++
			waiting = append(waiting, strings.Replace(key, "/", " ", 1))
		}
	}
	state, msg := "Pending", fmt.Sprintf("%d/%d objects Ready", ready, total)
	switch {
	case len(problems) > 0:
		state, msg = "Error", msg+"; "+strings.Join(problems, "; ")
	case ready == total:
		state = "Ready"
	default:
		msg += "; waiting for " + strings.Join(waiting, ", ")
	}
	out := status.Outcome{Ready: state == "Ready", Stalled: state == "Error", Reason: "IAMConfig" + state, Message: msg}
	if state != "Error" {
		out.EventType = corev1.EventTypeNormal
	}
	want := cm.DeepCopy()
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[AnnotationCompatState], want.Annotations[AnnotationCompatMsg] = state, msg
	step := status.Step{Client: r.configMaps, Recorder: r.recorder}
	return step.WriteAnnotations(ctx, cm, want, "IAMConfig"+cm.Annotations[AnnotationCompatState], out)
}

func listed(expected map[string]bool, key string) bool {
	_, ok := expected[key]
	return ok
}
