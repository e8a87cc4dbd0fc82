package iam

import (
	"context"
	"fmt"
	"time"

	"k8s.io/utils/ptr"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awseks"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// The EKS Pod Identity association of an IAMServiceAccount. status.podIdentityAssociation is the
// record of it: written (with the cluster) before the association is created, completed with its
// ID once created, found or adopted, and cleared once it is deleted. EKS is called only while the
// mechanism needs an association or the record says one may exist, so an IRSA object makes no EKS
// call (and IRSA keeps working on clusters that are not EKS).

// ensureAssociation creates, repairs or adopts the association of the IAMServiceAccount's
// ServiceAccount to roleARN in the operator's EKS cluster. It returns nil once the association is
// confirmed to exist with the role: a read of it, or the answer to its creation or repair.
func (r *ServiceAccountReconciler) ensureAssociation(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, roleARN string, ch *changes) *status.Outcome {
	if err := r.cfg.eksClusterErr; err != nil {
		return ptr.To(status.WaitsForPerson(ReasonEKSClusterName, err.Error(), r.SlowRetry))
	}
	cluster := r.cfg.eksCluster
	if rec := sa.Status.PodIdentityAssociation; rec != nil && rec.ClusterName != cluster {
		// --eks-cluster-name changed: the association in the other cluster goes first.
		if o := r.removeAssociation(ctx, sa, ch); o != nil {
			return o
		}
	}
	if sa.Status.PodIdentityAssociation == nil {
		// Recorded before the creation, so that an association whose answer is lost (a crash, a
		// timeout) is still found and deleted if the mechanism changes before the next reconcile.
		before := sa.DeepCopy()
		sa.Status.PodIdentityAssociation = &iamv1alpha1.PodIdentityAssociationStatus{ClusterName: cluster}
		// A copy is patched: the patch reads the object back, and sa holds this reconcile's
		// observations (the role) that the status patch at its end writes.
		if err := r.step().Write(ctx, sa.DeepCopy(), before); err != nil {
			return ptr.To(status.Transient(ReasonAWSError, "recording the Pod Identity association to create: "+err.Error(), err))
		}
	}
	rec := sa.Status.PodIdentityAssociation
	a, o := r.observeAssociation(ctx, sa, rec, ch)
	if o != nil {
		return o
	}
	if a == nil {
		created, err := r.eks.Create(ctx, awseks.NewAssociation{
			Cluster: cluster, Namespace: sa.Namespace, ServiceAccount: sa.Spec.ServiceAccountName, RoleARN: roleARN,
			Target: target(sa), Tags: irsa.Tags(r.cfg.cluster, sa.Namespace, sa.Name),
		})
		if awseks.IsInUse(err) {
			// Made by someone else since the list (or not listed yet): the next reconcile finds it.
			return ptr.To(status.Transient(ReasonConflict, awsiam.StatusMessage(err), err))
		} else if err != nil {
			return ptr.To(associationFailure(err, r.SlowRetry))
		}
		rec.AssociationID, rec.AssociationARN = created.ID, created.ARN
		rec.TargetRoleARN, rec.ExternalID = created.Target.RoleARN, created.ExternalID
		ch.add("created EKS Pod Identity association %s in cluster %s", created.ID, cluster)
		return nil
	}
	if !irsa.OwnedBy(a.Tags, r.cfg.cluster, sa.Namespace, sa.Name) {
		what := fmt.Sprintf("EKS Pod Identity association %s of ServiceAccount %s in cluster %s", a.ID, sa.Spec.ServiceAccountName, cluster)
		adopted, o := r.adopt(sa, what, a.Tags, func(t awsiam.Tags) error { return r.eks.Tag(ctx, a.ARN, t) })
		if !adopted {
			return &o
		}
		ch.add("adopted EKS Pod Identity association %s", a.ID)
	}
	rec.AssociationID, rec.AssociationARN = a.ID, a.ARN
	rec.TargetRoleARN, rec.ExternalID = a.Target.RoleARN, a.ExternalID
	if want := target(sa); a.RoleARN != roleARN || a.Target != want {
		updated, err := r.eks.Update(ctx, a, roleARN, want)
		if awseks.IsNotFound(err) {
			// Deleted since it was read: the next attempt makes it anew.
			return ptr.To(status.Transient(ReasonConflict, awsiam.StatusMessage(err), err))
		} else if err != nil {
			return ptr.To(associationFailure(err, r.SlowRetry))
		}
		rec.TargetRoleARN, rec.ExternalID = updated.Target.RoleARN, updated.ExternalID
		if a.RoleARN != roleARN {
			ch.add("EKS Pod Identity association %s: set role %s (was %s)", a.ID, roleARN, a.RoleARN)
		}
		if a.Target != want {
			ch.add("EKS Pod Identity association %s: set target role %q and session tags %s (were %q, %s)", a.ID,
				want.RoleARN, onOff(!want.DisableSessionTags), a.Target.RoleARN, onOff(!a.Target.DisableSessionTags))
		}
	}
	return nil
}

// target is where the spec wants the association to lead beyond the role.
func target(sa *iamv1alpha1.IAMServiceAccount) awseks.Target {
	return awseks.Target{RoleARN: sa.Spec.TargetRoleArn, DisableSessionTags: sa.Spec.DisableSessionTags}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// associationFailure is the outcome of a failed create or update of an association. EKS checks the
// role it names against its own view of IAM, which lags behind the role this reconcile has just
// read, created or re-trusted: its InvalidParameterException is then retried with backoff, as
// IAM's own NoSuchEntity after a read is, instead of stalling for the slow retry.
func associationFailure(err error, slow time.Duration) status.Outcome {
	if awseks.IsInvalidParameter(err) {
		return propagating(err)
	}
	return awsFailure(err, slow)
}

// observeAssociation reads the association the record names, or else the one EKS lists for the
// ServiceAccount; nil when there is none.
func (r *ServiceAccountReconciler) observeAssociation(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount,
	rec *iamv1alpha1.PodIdentityAssociationStatus, ch *changes) (*awseks.Association, *status.Outcome) {
	if rec.AssociationID != "" {
		a, err := r.eks.Describe(ctx, rec.ClusterName, rec.AssociationID)
		switch {
		case err == nil:
			return a, nil
		case !awseks.IsNotFound(err):
			return nil, ptr.To(awsFailure(err, r.SlowRetry))
		}
		ch.add("EKS Pod Identity association %s was deleted", rec.AssociationID)
		rec.AssociationID, rec.AssociationARN = "", ""
	}
	a, err := r.findAssociation(ctx, rec.ClusterName, sa)
	if err != nil {
		return nil, ptr.To(awsFailure(err, r.SlowRetry))
	}
	return a, nil
}

// findAssociation lists the ServiceAccount's associations in cluster and reads the one there is
// (EKS allows one per ServiceAccount and cluster), with its role and tags; nil when there is none.
// One deleted between the list and the read is none. A NotFound error is the list's: no such
// cluster.
func (r *ServiceAccountReconciler) findAssociation(ctx context.Context, cluster string, sa *iamv1alpha1.IAMServiceAccount) (*awseks.Association, error) {
	found, err := r.eks.Find(ctx, cluster, sa.Namespace, sa.Spec.ServiceAccountName)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	a, err := r.eks.Describe(ctx, cluster, found[0].ID)
	if awseks.IsNotFound(err) {
		return nil, nil
	}
	return a, err
}

// removeAssociation deletes the association the record names, or, when the record has no ID yet
// (its creation's answer was lost), the ServiceAccount's association if it carries this object's
// tags; never another. Then it clears the record.
func (r *ServiceAccountReconciler) removeAssociation(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, ch *changes) *status.Outcome {
	rec := sa.Status.PodIdentityAssociation
	if rec == nil {
		return nil
	}
	id := rec.AssociationID
	if id == "" {
		a, err := r.findAssociation(ctx, rec.ClusterName, sa)
		if err != nil && !awseks.IsNotFound(err) { // NotFound: the cluster itself is gone
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		if a != nil && irsa.OwnedBy(a.Tags, r.cfg.cluster, sa.Namespace, sa.Name) {
			id = a.ID
		}
	}
	if id != "" {
		if err := r.eks.Delete(ctx, rec.ClusterName, id); err != nil && !awseks.IsNotFound(err) {
			return ptr.To(awsFailure(err, r.SlowRetry))
		}
		ch.add("deleted EKS Pod Identity association %s", id)
	}
	sa.Status.PodIdentityAssociation = nil
	return nil
}
