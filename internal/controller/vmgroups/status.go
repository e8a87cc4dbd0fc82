package vmgroups

import (
	"cmp"
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	vcenter "github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
)

// failure is why a reconcile could not go on: the outcome to report and the phase to show.
type failure struct {
	status.Outcome
	phase computev1alpha1.Phase // default Pending
}

// vcenterFailure is a vCenter error: transient, backed off.
func vcenterFailure(err error) *failure {
	reason := "VCenterError"
	if vcenter.IsUnreachable(err) {
		reason = "VCenterUnreachable"
	}
	return &failure{Outcome: status.Transient(reason, err.Error(), err)}
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
	return &failure{phase: computev1alpha1.PhaseError, Outcome: status.WaitsForPerson(reason, message, 0)}
}

// fail records the failure and says when to try again (a problem a person must fix: after
// SlowRetry).
func (r *Reconciler) fail(vg *computev1alpha1.VmGroup, f *failure) (reconcile.Result, error) {
	phase := cmp.Or(f.phase, computev1alpha1.PhasePending)
	if !vg.DeletionTimestamp.IsZero() {
		phase = computev1alpha1.PhaseDeleting
	}
	o := f.Outcome
	if o.Err == nil && o.RequeueAfter == 0 {
		o.RequeueAfter = r.SlowRetry
	}
	r.report(vg, phase, o)
	return o.Result()
}

// report writes phase, message and conditions, with an Event when the Ready reason changes (not
// on every retry). Steps on the way (clones, power-ons) record their own Events and are Silenced.
func (r *Reconciler) report(vg *computev1alpha1.VmGroup, phase computev1alpha1.Phase, o status.Outcome) {
	vg.Status.Phase = phase
	vg.Status.LastMessage = o.Message
	r.step().Conclude(vg, status.Reported{Conditions: &vg.Status.Conditions, ObservedGeneration: &vg.Status.ObservedGeneration}, o)
}

// step is how the reconciler reports (status.Step): its client and recorder.
func (r *Reconciler) step() status.Step { return status.Step{Client: r.Client, Recorder: r.Recorder} }
