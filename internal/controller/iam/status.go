package iam

import (
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/cloud/aws/awsiam"
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
)

// personFixable are the AWS error codes that retrying cannot fix: the spec, the account's limits
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
}

// outcome is what a reconcile concluded, for the status and the workqueue.
type outcome struct {
	ready   bool
	reason  string
	message string
	stalled bool          // Stalled=True: waits for a person or a spec change
	err     error         // returned, so the workqueue backs off
	retry   time.Duration // otherwise checked again after this long (0: only on a change)
	// announced: the reconcile already recorded an Event saying what it changed, so reaching
	// Ready needs no second one.
	announced bool
}

func announced(o outcome) outcome {
	o.announced = true
	return o
}

func synced(msg string, resync time.Duration) outcome {
	return outcome{ready: true, reason: ReasonSynced, message: msg, retry: wait.Jitter(resync, 0.1)}
}

// awsFailure turns an AWS error into an outcome: throttling, 5xx and network errors back off;
// errors a person must fix stall with AWS's code as the reason and are retried slowly, so they
// never become a hot loop.
func awsFailure(err error, slow time.Duration) outcome {
	msg := awsiam.StatusMessage(err)
	if awsiam.IsThrottleOrServer(err) {
		return outcome{reason: ReasonAWSUnavailable, message: msg, err: err}
	}
	if code := awsiam.ErrorCode(err); personFixable[code] && reasonPattern.MatchString(code) {
		return outcome{reason: code, message: msg, stalled: true, retry: slow}
	}
	return outcome{reason: ReasonAWSError, message: msg, err: err}
}

// propagating is a NoSuchEntity about an object IAM has just created or returned: IAM is
// eventually consistent, so it is retried with backoff instead of stalling.
func propagating(err error) outcome {
	return outcome{reason: ReasonPropagating, message: awsiam.StatusMessage(err) + " (IAM has not propagated it yet; retrying)", err: err}
}

// reasonPattern is metav1.Condition's rule for reasons.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// result is what the workqueue gets for an outcome.
func (o outcome) result() (reconcile.Result, error) {
	if o.err != nil {
		return reconcile.Result{}, o.err
	}
	return reconcile.Result{RequeueAfter: o.retry}, nil
}

// setConditions writes Ready, Reconciling and Stalled for the outcome and emits an Event when the
// Ready reason changes (not on every retry).
func setConditions(rec events.EventRecorder, obj runtime.Object, conds *[]metav1.Condition, gen int64, o outcome) {
	before := meta.FindStatusCondition(*conds, iamv1alpha1.ConditionReady)
	prevReason := ""
	if before != nil {
		prevReason = before.Reason
	}
	set := func(t string, ok bool) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(conds, metav1.Condition{
			Type: t, Status: status, Reason: o.reason, Message: o.message, ObservedGeneration: gen,
		})
	}
	set(iamv1alpha1.ConditionReady, o.ready)
	if !o.ready && !o.stalled {
		set(iamv1alpha1.ConditionReconciling, true)
	} else {
		meta.RemoveStatusCondition(conds, iamv1alpha1.ConditionReconciling)
	}
	if o.stalled {
		set(iamv1alpha1.ConditionStalled, true)
	} else {
		meta.RemoveStatusCondition(conds, iamv1alpha1.ConditionStalled)
	}
	if prevReason == o.reason || (o.ready && o.announced) {
		return
	}
	if o.ready {
		rec.Eventf(obj, nil, corev1.EventTypeNormal, o.reason, "Reconcile", "%s", o.message)
	} else {
		rec.Eventf(obj, nil, corev1.EventTypeWarning, o.reason, "Reconcile", "%s", o.message)
	}
}
