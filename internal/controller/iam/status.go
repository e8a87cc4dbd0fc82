package iam

import (
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
)

// Ready reasons (see docs/iam.md for when each appears).
const (
	ReasonSynced                 = "Synced"
	ReasonAWSUnavailable         = "AWSUnavailable"
	ReasonAWSError               = "AWSError"
	ReasonConflict               = "Conflict"
	ReasonPolicyNotAllowed       = "PolicyNotAllowed"
	ReasonPolicyNotReady         = "PolicyNotReady"
	ReasonServiceAccountNotFound = "ServiceAccountNotFound"
	ReasonServiceAccountConflict = "ServiceAccountConflict"
	ReasonInUse                  = "InUse"
	ReasonDeleting               = "Deleting"
	ReasonPropagating            = "Propagating"
	// ReasonEKSClusterName: the object needs a Pod Identity association, and --eks-cluster-name is
	// not set while --cluster-name is no EKS cluster name.
	ReasonEKSClusterName = "EKSClusterNameInvalid"
	// ReasonOIDCIssuerNotSet: the object's role would have to trust the cluster's OIDC provider
	// (IRSA) and --oidc-issuer is not set.
	ReasonOIDCIssuerNotSet = "OIDCIssuerNotSet"
)

// personFixable are the AWS (IAM and EKS) error codes that retrying cannot fix: the spec, the account's limits
// or the operator's permissions must change first. They surface as the Ready reason.
var personFixable = map[string]bool{
	"MalformedPolicyDocument": true,
	"LimitExceeded":           true,
	"NoSuchEntity":            true,
	"AccessDenied":            true,
	"InvalidInput":            true,
	"ValidationError":         true,
	"PolicyNotAttachable":     true,
	"UnmodifiableEntity":      true,
	// EKS: an unknown cluster, a refused parameter, missing permissions.
	"ResourceNotFoundException": true,
	"InvalidParameterException": true,
	"InvalidRequestException":   true,
	"AccessDeniedException":     true,
}

func synced(msg string, resync time.Duration) status.Outcome {
	return status.Healthy(ReasonSynced, msg, resync)
}

// awsFailure turns an AWS error into an outcome: throttling, 5xx and network errors back off;
// errors a person must fix stall with AWS's code as the reason and are retried slowly, so they
// never become a hot loop.
func awsFailure(err error, slow time.Duration) status.Outcome {
	msg := awsiam.StatusMessage(err)
	if awsiam.IsThrottleOrServer(err) {
		return status.Transient(ReasonAWSUnavailable, msg, err)
	}
	if code := awsiam.ErrorCode(err); personFixable[code] && status.ValidReason(code) {
		return status.WaitsForPerson(code, msg, slow)
	}
	return status.Transient(ReasonAWSError, msg, err)
}

// propagating is a NoSuchEntity about an object IAM has just created or returned: IAM is
// eventually consistent, so it is retried with backoff instead of stalling.
func propagating(err error) status.Outcome {
	return status.Transient(ReasonPropagating, awsiam.StatusMessage(err)+" (IAM has not propagated it yet; retrying)", err)
}
