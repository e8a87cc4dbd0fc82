package vmgroups

import (
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
)

// state is what a reconcile concluded, for the status.
type state struct {
	phase       computev1alpha1.Phase
	ready       bool
	reason      string
	message     string
	progressing bool // Reconciling=True
	stalled     bool // Stalled=True: waits for a person
}

// failure is why a reconcile could not go on.
type failure struct {
	phase   computev1alpha1.Phase // default Pending
	reason  string
	message string
	err     error         // returned, so the workqueue backs off
	retry   time.Duration // otherwise: check again after this long
	stalled bool
}

// vcenterFailure is a vCenter error: transient, backed off.
func vcenterFailure(err error) *failure {
	reason := "VCenterError"
	if vcenter.IsUnreachable(err) {
		reason = "VCenterUnreachable"
	}
	return &failure{reason: reason, message: err.Error(), err: err}
}

// classify turns an adapter error into a failure. A template or placement item that is missing
// or cannot be used as given (a name matching several, something other than a folder at the
// folder's path, …) waits for a person: shown as an Error, Stalled, retried slowly rather than
// with the fast backoff. Anything else is a vCenter error.
func classify(err error) *failure {
	var nf *vcenter.NotFoundError
	var inv *vcenter.InvalidError
	switch {
	case errors.As(err, &nf):
		return personFailure(nf.Kind, "NotFound", nf.Error())
	case errors.As(err, &inv):
		return personFailure(inv.Kind, "Invalid", inv.Error())
	}
	return vcenterFailure(err)
}

func personFailure(kind, what, message string) *failure {
	reason := "Placement" + what
	if kind == "template" {
		reason = "Template" + what
	}
	return &failure{phase: computev1alpha1.PhaseError, reason: reason, message: message, stalled: true}
}

// fail records the failure and says when to try again.
func (r *Reconciler) fail(vg *computev1alpha1.VmGroup, before *computev1alpha1.VmGroupStatus, f *failure) (reconcile.Result, error) {
	phase := f.phase
	if phase == "" {
		phase = computev1alpha1.PhasePending
	}
	if !vg.DeletionTimestamp.IsZero() {
		phase = computev1alpha1.PhaseDeleting
	}
	r.setState(vg, before, state{phase: phase, reason: f.reason, message: f.message, stalled: f.stalled, progressing: !f.stalled})
	if f.err != nil {
		return reconcile.Result{}, f.err
	}
	retry := f.retry
	if retry == 0 {
		retry = r.SlowRetry
	}
	return reconcile.Result{RequeueAfter: retry}, nil
}

// setState writes phase, message and conditions, and emits an Event when the Ready reason changes
// (not on every retry).
func (r *Reconciler) setState(vg *computev1alpha1.VmGroup, before *computev1alpha1.VmGroupStatus, s state) {
	st := &vg.Status
	st.Phase = s.phase
	st.LastMessage = s.message
	st.ObservedGeneration = vg.Generation
	set := func(t string, ok bool, reason, msg string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: vg.Generation,
		})
	}
	set(computev1alpha1.ConditionReady, s.ready, s.reason, s.message)
	if s.progressing {
		set(computev1alpha1.ConditionReconciling, true, s.reason, s.message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, computev1alpha1.ConditionReconciling)
	}
	if s.stalled {
		set(computev1alpha1.ConditionStalled, true, s.reason, s.message)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, computev1alpha1.ConditionStalled)
	}

	prev := meta.FindStatusCondition(before.Conditions, computev1alpha1.ConditionReady)
	if prev != nil && prev.Reason == s.reason {
		return
	}
	switch {
	case s.ready:
		r.Recorder.Eventf(vg, nil, corev1.EventTypeNormal, s.reason, "Reconcile", "%s", s.message)
	case s.stalled || s.phase == computev1alpha1.PhaseError ||
		s.reason == "VCenterUnreachable" || s.reason == "VCenterError" || s.reason == "LoginFailed" || s.reason == "CredentialsUnavailable":
		r.Recorder.Eventf(vg, nil, corev1.EventTypeWarning, s.reason, "Reconcile", "%s", s.message)
	}
}
