package iam

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iampolicies,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iampolicies/status,verbs=get;patch
// +kubebuilder:rbac:groups=iam.quartermaster.dev,resources=iampolicies/finalizers,verbs=update

// PolicyReconciler keeps each IAMPolicy's managed policy in AWS as its spec says.
type PolicyReconciler struct {
	*base
}

func (r *PolicyReconciler) setupWithManager(mgr ctrl.Manager) error {
	return builder.ControllerManagedBy(mgr).
		Named("iampolicy").
		// Only spec changes and the start of deletion: the controller's own status and finalizer
		// writes must not cause IAM calls.
		For(&iamv1alpha1.IAMPolicy{}, builder.WithPredicates(specOrDeletion())).
		// A deletion waiting for its users goes on when an IAMServiceAccount stops using it.
		Watches(&iamv1alpha1.IAMServiceAccount{}, handler.EnqueueRequestsFromMapFunc(r.deletingPoliciesOf),
			builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, deletionStarted()))).
		WithOptions(r.controllerOptions()).
		Complete(r)
}

// deletingPoliciesOf maps an IAMServiceAccount to the policies it names that are being deleted.
func (r *PolicyReconciler) deletingPoliciesOf(ctx context.Context, obj client.Object) []reconcile.Request {
	sa, ok := obj.(*iamv1alpha1.IAMServiceAccount)
	if !ok {
		return nil
	}
	var reqs []reconcile.Request
	for _, name := range sa.Spec.Policies {
		p := &iamv1alpha1.IAMPolicy{}
		key := client.ObjectKey{Namespace: sa.Namespace, Name: name}
		if r.client.Get(ctx, key, p) == nil && !p.DeletionTimestamp.IsZero() {
			reqs = append(reqs, reconcile.Request{NamespacedName: key})
		}
	}
	return reqs
}

// Reconcile brings one IAMPolicy's AWS policy to its spec, or deletes it.
func (r *PolicyReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	p := &iamv1alpha1.IAMPolicy{}
	if err := r.client.Get(ctx, req.NamespacedName, p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return r.reconcileObject(ctx, p, status.Reported{Conditions: &p.Status.Conditions, ObservedGeneration: &p.Status.ObservedGeneration},
		func() (status.Outcome, bool) { return r.delete(ctx, p) },
		func() status.Outcome { return r.sync(ctx, p) })
}

// policyARN is the ARN the policy has (or will have) in AWS: names are unique per account, the
// path is ours.
// It is always derived, never read from the status, which anyone allowed to write the status could
// point at another policy.
func (r *PolicyReconciler) policyARN(ctx context.Context, p *iamv1alpha1.IAMPolicy) (string, error) {
	return r.expectedPolicyARN(ctx, p)
}

// sync creates the policy, or makes its default version say what the spec says.
func (r *PolicyReconciler) sync(ctx context.Context, p *iamv1alpha1.IAMPolicy) status.Outcome {
	doc, err := irsa.PolicyDocumentJSON(p.Spec.Document)
	if err != nil {
		return status.WaitsForPerson("MalformedPolicyDocument", err.Error(), 0)
	}
	name := irsa.PolicyName(p.Namespace, p.Name)
	p.Status.PolicyName = name
	arn, err := r.policyARN(ctx, p)
	if err != nil {
		return awsFailure(err, r.SlowRetry)
	}
	pol, err := r.aws.GetPolicy(ctx, arn)
	if awsiam.IsNotFound(err) {
		pol, err = r.aws.CreatePolicy(ctx, awsiam.NewPolicy{
			Name: name, Path: r.policyPath(p), Description: p.Spec.Description, Document: doc,
			Tags: irsa.Tags(r.cfg.cluster, p.Namespace, p.Name),
		})
		if err == nil {
			r.recordPolicy(p, pol)
			r.recorder.Eventf(p, nil, corev1.EventTypeNormal, "PolicyCreated", "Create", "created IAM policy %s", pol.ARN)
			return synced("policy "+pol.ARN+" created", r.cfg.resync).Silenced()
		}
		if awsiam.IsAlreadyExists(err) {
			// IAM is eventually consistent: look again before calling it someone else's. Names
			// are unique in the account whatever the path, so it may be elsewhere.
			if pol, err = r.aws.GetPolicy(ctx, arn); awsiam.IsNotFound(err) {
				return status.WaitsForPerson(ReasonConflict, fmt.Sprintf(
					"an IAM policy named %s already exists outside %s; it is left alone (to adopt it, annotate %s with its path, e.g. /)",
					name, r.policyPath(p), iamv1alpha1.AnnotationAdopt), r.SlowRetry)
			}
		}
	}
	if err != nil {
		return awsFailure(err, r.SlowRetry)
	}
	if !irsa.OwnedBy(pol.Tags, r.cfg.cluster, p.Namespace, p.Name) {
		adopted, o := r.adopt(p, "IAM policy "+arn, pol.Tags, func(tags awsiam.Tags) error { return r.aws.TagPolicy(ctx, arn, tags) })
		if !adopted {
			return o
		}
	}
	r.recordPolicy(p, pol)
	current, err := r.aws.GetPolicyDocument(ctx, arn, pol.DefaultVersionID)
	if err != nil {
		return awsFailure(err, r.SlowRetry)
	}
	same, err := irsa.Equivalent(current, doc)
	if err != nil {
		log.FromContext(ctx).Info("the policy's default version does not parse; replacing it", "arn", arn, "error", err.Error())
	}
	if same {
		return synced("policy "+arn+" in sync ("+pol.DefaultVersionID+")", r.cfg.resync)
	}
	// A new default version; AWS keeps at most 5, so the oldest non-default one goes first.
	versions, err := r.aws.ListPolicyVersions(ctx, arn)
	if err != nil {
		return awsFailure(err, r.SlowRetry)
	}
	if id, ok := irsa.VersionToPrune(domainVersions(versions)); ok {
		if err := r.aws.DeletePolicyVersion(ctx, arn, id); err != nil && !awsiam.IsNotFound(err) {
			return awsFailure(err, r.SlowRetry)
		}
	}
	vid, err := r.aws.CreatePolicyVersion(ctx, arn, doc)
	if err != nil {
		return awsFailure(err, r.SlowRetry)
	}
	p.Status.DefaultVersionID = vid
	r.recorder.Eventf(p, nil, corev1.EventTypeNormal, "PolicyUpdated", "Update", "IAM policy %s: new default version %s", arn, vid)
	return synced("policy "+arn+" updated to "+vid, r.cfg.resync).Silenced()
}

func (r *PolicyReconciler) recordPolicy(p *iamv1alpha1.IAMPolicy, pol *awsiam.Policy) {
	p.Status.ARN, p.Status.PolicyID, p.Status.DefaultVersionID = pol.ARN, pol.ID, pol.DefaultVersionID
}

func domainVersions(vs []awsiam.PolicyVersion) []irsa.PolicyVersion {
	out := make([]irsa.PolicyVersion, 0, len(vs))
	for _, v := range vs {
		out = append(out, irsa.PolicyVersion{ID: v.ID, IsDefault: v.IsDefault, Created: v.Created})
	}
	return out
}

// delete removes the policy from AWS (detached from every role, versions first) unless it is
// retained or still named by an IAMServiceAccount, then releases the object.
func (r *PolicyReconciler) delete(ctx context.Context, p *iamv1alpha1.IAMPolicy) (status.Outcome, bool) {
	if !controllerutil.ContainsFinalizer(p, Finalizer) {
		return status.Outcome{}, true
	}
	if p.Annotations[iamv1alpha1.AnnotationDeletionPolicy] == iamv1alpha1.DeletionPolicyRetain {
		r.recorder.Eventf(p, nil, corev1.EventTypeNormal, "Retained", "Delete", "IAM policy %s kept in AWS (deletion-policy: retain)", p.Status.ARN)
		return r.release(ctx, p)
	}
	users, err := r.usersOf(ctx, p)
	if err != nil {
		return status.Transient(ReasonDeleting, err.Error(), err), false
	}
	if len(users) > 0 {
		return status.Progressing(ReasonInUse, fmt.Sprintf(
			"waiting to delete the IAM policy: still named by IAMServiceAccount %s", strings.Join(users, ", ")), wait.Jitter(r.cfg.resync, 0.1)), false
	}
	arn, err := r.policyARN(ctx, p)
	if err != nil {
		return awsFailure(err, r.SlowRetry), false
	}
	pol, err := r.aws.GetPolicy(ctx, arn)
	if awsiam.IsNotFound(err) {
		return r.release(ctx, p)
	}
	if err != nil {
		return awsFailure(err, r.SlowRetry), false
	}
	if !irsa.OwnedBy(pol.Tags, r.cfg.cluster, p.Namespace, p.Name) {
		r.recorder.Eventf(p, nil, corev1.EventTypeWarning, ReasonConflict, "Delete", "IAM policy %s is not tagged as this object's; left in AWS", arn)
		return r.release(ctx, p)
	}
	if err := r.deletePolicy(ctx, arn); awsiam.IsConflict(err) {
		return status.WaitsForPerson("DeleteConflict", awsiam.StatusMessage(err)+
			" (the policy is still attached to a user or group, or is a permissions boundary: remove that, or set the retain annotation)", r.SlowRetry), false
	} else if err != nil {
		return awsFailure(err, r.SlowRetry), false
	}
	r.recorder.Eventf(p, nil, corev1.EventTypeNormal, "PolicyDeleted", "Delete", "deleted IAM policy %s", arn)
	return r.release(ctx, p)
}

// deletePolicy does what IAM requires before DeletePolicy: detach it everywhere and delete its
// non-default versions. Something already gone is fine, so an interrupted deletion resumes.
func (r *PolicyReconciler) deletePolicy(ctx context.Context, arn string) error {
	roles, err := r.aws.ListRolesForPolicy(ctx, arn)
	if err != nil {
		return err
	}
	for _, role := range roles {
		if err := r.aws.DetachPolicy(ctx, role, arn); err != nil && !awsiam.IsNotFound(err) {
			return err
		}
	}
	versions, err := r.aws.ListPolicyVersions(ctx, arn)
	if err != nil {
		return err
	}
	for _, v := range versions {
		if v.IsDefault {
			continue
		}
		if err := r.aws.DeletePolicyVersion(ctx, arn, v.ID); err != nil && !awsiam.IsNotFound(err) {
			return err
		}
	}
	if err := r.aws.DeletePolicy(ctx, arn); err != nil && !awsiam.IsNotFound(err) {
		return err
	}
	return nil
}

// usersOf lists the IAMServiceAccounts of the namespace that name the policy, deleting or not
// (a deleting one detaches it first).
func (r *PolicyReconciler) usersOf(ctx context.Context, p *iamv1alpha1.IAMPolicy) ([]string, error) {
	list := &iamv1alpha1.IAMServiceAccountList{}
	if err := r.client.List(ctx, list, client.InNamespace(p.Namespace), client.MatchingFields{indexPolicies: p.Name}); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Items))
	for _, sa := range list.Items {
		names = append(names, sa.Name)
	}
	slices.Sort(names)
	return names, nil
}

func (r *PolicyReconciler) release(ctx context.Context, p *iamv1alpha1.IAMPolicy) (status.Outcome, bool) {
	if err := r.patchFinalizer(ctx, p, false); err != nil {
		return status.Transient(ReasonDeleting, err.Error(), err), false
	}
	return status.Outcome{}, true
}
