package iam

import (
	"context"
	"fmt"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
)

// targetPolicyName is the inline policy that lets an object's role assume its target role.
const targetPolicyName = "quartermaster-target-role"

// Reasons of a target role that does not (yet) take the association's credentials.
const (
	ReasonTargetRoleNotFound    = "TargetRoleNotFound"
	ReasonTargetRoleNotTrusting = "TargetRoleNotTrusting"
)

// targetActions are what the association's role does to the target.
func targetActions(sa *iamv1alpha1.IAMServiceAccount) []string {
	return irsa.TargetActions(!sa.Spec.DisableSessionTags)
}

// targetTrust is the statement the target role's trust policy needs.
func targetTrust(sa *iamv1alpha1.IAMServiceAccount, roleARN, externalID string) string {
	return irsa.TargetTrustStatement(roleARN, externalID, targetActions(sa))
}

// checkTarget says whether the target role takes the association's credentials. A target in this
// account is read: missing, or its trust not admitting the role with the external ID, stalls the
// object with the statement to add. One in another account cannot be read from here: the Ready
// message says what its trust must hold (note).
func (r *ServiceAccountReconciler) checkTarget(ctx context.Context, sa *iamv1alpha1.IAMServiceAccount, roleARN string) (string, *status.Outcome) {
	target := sa.Spec.TargetRoleArn
	rec := sa.Status.PodIdentityAssociation
	if target == "" || rec == nil {
		return "", nil
	}
	need := targetTrust(sa, roleARN, rec.ExternalID)
	account, name := irsa.RoleAccountAndName(target)
	ours, err := r.accountID(ctx)
	if err != nil {
		o := awsFailure(err, r.SlowRetry)
		return "", &o
	}
	if account != ours {
		return fmt.Sprintf("; pods get target role %s (account %s, not readable from here): its trust policy must hold %s", target, account, need), nil
	}
	role, err := r.aws.GetRole(ctx, name)
	switch {
	case awsiam.IsNotFound(err):
		o := status.WaitsForPerson(ReasonTargetRoleNotFound, fmt.Sprintf("target role %s does not exist; create it with a trust policy holding %s", target, need), r.SlowRetry)
		return "", &o
	case err != nil:
		o := awsFailure(err, r.SlowRetry)
		return "", &o
	}
	if !irsa.TrustsWithExternalID(role.TrustPolicy, roleARN, rec.ExternalID, targetActions(sa)) {
		o := status.WaitsForPerson(ReasonTargetRoleNotTrusting, fmt.Sprintf(
			"target role %s does not let role %s assume it with the association's external ID %s: add to its trust policy %s", target, roleARN, rec.ExternalID, need), r.SlowRetry)
		return "", &o
	}
	return fmt.Sprintf("; pods get target role %s (its trust requires external ID %s)", target, rec.ExternalID), nil
}
