// Package status is how every Quartermaster controller reports what a reconcile concluded: an
// Outcome, ended by the one status Step (step.go), becomes kstatus conditions (Ready, Reconciling,
// Stalled) with observedGeneration, an Event when the Ready reason changes, one status patch when
// the status changed, and the workqueue's next step. Its client (NewClient) never
// hands a reconcile a cached copy older than this process's own last write, so a status-driven
// decision (an Event, a cloud call, a path recorded in the status) is not taken twice.
//
// docs/development.md says how a controller uses it.
package status

import (
	"regexp"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Condition types, as kstatus reads them: Ready summarizes, Reconciling and Stalled qualify.
const (
	Ready       = "Ready"
	Reconciling = "Reconciling"
	Stalled     = "Stalled"
)

// resyncJitter spreads the healthy resyncs of objects created together.
const resyncJitter = 0.1

// Outcome is what one reconcile concluded: the reason and message a user sees, and when to look
// again. Build it with Healthy, Progressing, Transient or WaitsForPerson.
type Outcome struct {
	// Ready: the object is as its spec says.
	Ready bool
	// Stalled: nothing changes until a person fixes the spec, a referenced object or the
	// operator's configuration; retried slowly, never in a hot loop.
	Stalled bool
	// Reason is a metav1.Condition reason (CamelCase); Message says what a user can do.
	Reason  string
	Message string
	// Err is returned to the workqueue, so it backs off (transient failures).
	Err error
	// RequeueAfter is when to look again without an error (0: only on a watched change).
	RequeueAfter time.Duration
	// Quiet: no Event for this outcome even when the reason changes, because the reconcile has
	// already recorded Events saying what it did.
	Quiet bool
	// EventType overrides the Event's type (default: Normal when Ready, Warning otherwise), for
	// states on an expected path that are not ready (a namespace being deleted at its ttl).
	EventType string
}

// Healthy is a Ready outcome, checked again after a jittered resync (the drift check).
func Healthy(reason, message string, resync time.Duration) Outcome {
	return Outcome{Ready: true, Reason: reason, Message: message, RequeueAfter: jitter(resync)}
}

// Progressing is on its way without a failure (a step done, a dependency not ready yet):
// Reconciling, looked at again after `after` or on a watched change when 0.
func Progressing(reason, message string, after time.Duration) Outcome {
	return Outcome{Reason: reason, Message: message, RequeueAfter: after}
}

// Transient is a failure a retry can fix (a cloud outage, throttling, a conflict): the workqueue
// backs off.
func Transient(reason, message string, err error) Outcome {
	return Outcome{Reason: reason, Message: message, Err: err}
}

// WaitsForPerson is a failure only a person can fix: Stalled, retried slowly after retry.
func WaitsForPerson(reason, message string, retry time.Duration) Outcome {
	return Outcome{Stalled: true, Reason: reason, Message: message, RequeueAfter: retry}
}

// Silenced returns o without its own Event (the reconcile recorded what it did already).
func (o Outcome) Silenced() Outcome {
	o.Quiet = true
	return o
}

// Result is what the workqueue gets for the outcome.
func (o Outcome) Result() (reconcile.Result, error) {
	if o.Err != nil {
		return reconcile.Result{}, o.Err
	}
	return reconcile.Result{RequeueAfter: o.RequeueAfter}, nil
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return wait.Jitter(d, resyncJitter)
}

// reasonPattern is metav1.Condition's rule for reasons.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// ValidReason reports whether s may be a condition reason (an AWS error code, say, may not).
func ValidReason(s string) bool {
	return len(s) <= 1024 && reasonPattern.MatchString(s)
}

// WaitingFor is the Ready reason of an object waiting for another it made to report.
const WaitingFor = "WaitingFor"

// Dependent is the outcome of an object whose readiness is another's (what names it, conds and
// generation are its): nil when that one is Ready for its generation. Otherwise its reason and
// message, Stalled when it is, or WaitingFor while it has not reported on its generation. The
// other's status change wakes the dependent (a watch), so nothing is requeued.
func Dependent(what string, conds []metav1.Condition, generation int64) *Outcome {
	c := meta.FindStatusCondition(conds, Ready)
	switch {
	case c == nil || c.ObservedGeneration != generation:
		o := Progressing(WaitingFor, what+" has not reported yet", 0)
		return &o
	case c.Status == metav1.ConditionTrue:
		return nil
	}
	msg := what + ": " + c.Message
	if s := meta.FindStatusCondition(conds, Stalled); s != nil && s.Status == metav1.ConditionTrue {
		o := WaitsForPerson(c.Reason, msg, 0)
		return &o
	}
	o := Progressing(c.Reason, msg, 0)
	return &o
}
