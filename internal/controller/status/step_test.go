package status

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestStepWritesOnlyChanges: against a real API server, End writes the status once when it
// changed and not at all when it did not; its patch carries only the status (a finalizer patch in
// between neither conflicts nor is undone); a reconcile whose context has ended still writes; an
// object deleted meanwhile is no error.
func TestStepWritesOnlyChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	scheme := manager.Scheme(computev1alpha1.AddToScheme)
	counted, requests := testenv.Counting(env.Config)
	c, err := client.New(counted, client.Options{Scheme: scheme})
	must(t, err)
	vg := &computev1alpha1.VmGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace(t), Name: "g"},
		Spec:       computev1alpha1.VmGroupSpec{CPU: 1, Memory: 1, Template: "t"},
	}
	must(t, c.Create(ctx, vg))
	step := Step{Client: c, Recorder: events.NewFakeRecorder(10)}
	reported := func(vg *computev1alpha1.VmGroup) Reported {
		return Reported{Conditions: &vg.Status.Conditions, ObservedGeneration: &vg.Status.ObservedGeneration}
	}

	// A reconcile: a finalizer patch (a new resourceVersion), then the conclusion.
	before := vg.DeepCopy()
	withFinalizer := vg.DeepCopy()
	controllerutil.AddFinalizer(withFinalizer, "test.quartermaster.dev/f")
	must(t, c.Patch(ctx, withFinalizer, client.MergeFrom(vg)))
	vg.Status.Phase = computev1alpha1.PhaseRunning
	requests.Reset()
	res, err := step.End(ctx, vg, before, reported(vg), Healthy("Running", "1/1 VMs running", 0))
	must(t, err)
	if res.RequeueAfter != 0 || requests.Writes() != 1 {
		t.Fatalf("End: %+v, %d writes (%v); want one status patch", res, requests.Writes(), requests.Log())
	}
	stored := &computev1alpha1.VmGroup{}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(vg), stored))
	if stored.Status.Phase != computev1alpha1.PhaseRunning || ReadyReason(stored.Status.Conditions) != "Running" ||
		stored.Status.ObservedGeneration != stored.Generation || !controllerutil.ContainsFinalizer(stored, "test.quartermaster.dev/f") {
		t.Fatalf("stored: phase %q, Ready %q, observedGeneration %d of %d, finalizers %v",
			stored.Status.Phase, ReadyReason(stored.Status.Conditions), stored.Status.ObservedGeneration, stored.Generation, stored.Finalizers)
	}

	// The same conclusion again: nothing to write.
	again := stored.DeepCopy()
	requests.Reset()
	_, err = step.End(ctx, again, stored, reported(again), Healthy("Running", "1/1 VMs running", 0))
	must(t, err)
	if requests.Total() != 0 {
		t.Errorf("an unchanged status made requests: %v", requests.Log())
	}

	// The reconcile ran out of time: the status is written all the same.
	ended, cancel := context.WithCancel(ctx)
	cancel()
	late := stored.DeepCopy()
	late.Status.Phase = computev1alpha1.PhasePending
	_, err = step.End(ended, late, stored, reported(late), Transient("VCenterUnavailable", "vCenter did not answer", context.DeadlineExceeded))
	if err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("End of a failed reconcile returned %v, want its error for the workqueue", err)
	}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(vg), stored))
	if ReadyReason(stored.Status.Conditions) != "VCenterUnavailable" || stored.Status.Phase != computev1alpha1.PhasePending {
		t.Errorf("after a reconcile whose context ended: Ready %q, phase %q; want VCenterUnavailable, Pending", ReadyReason(stored.Status.Conditions), stored.Status.Phase)
	}

	// Deleted meanwhile: nothing to report to, no error.
	gone := stored.DeepCopy()
	withoutFinalizer := stored.DeepCopy()
	withoutFinalizer.Finalizers = nil
	must(t, c.Patch(ctx, withoutFinalizer, client.MergeFrom(stored)))
	must(t, c.Delete(ctx, withoutFinalizer))
	gone.Status.Phase = computev1alpha1.PhaseRunning
	if err := step.Write(ctx, gone, stored); err != nil {
		t.Errorf("Write of a deleted object: %v", err)
	}
}

// TestStatusPatchSendsTheWholeStatusAndItsRemovals: the patch carries every field of the new
// status (a required field left at its zero value included: the stored object may have no status
// yet) and null for what was removed, at any depth.
func TestStatusPatchSendsTheWholeStatusAndItsRemovals(t *testing.T) {
	t.Parallel()
	was := json.RawMessage(`{"count":0,"name":"","association":{"cluster":"a","id":"x"},"gone":"yes","conditions":[{"type":"Ready"}]}`)
	now := json.RawMessage(`{"count":0,"name":"","association":{"cluster":"a"},"conditions":[{"type":"Ready"},{"type":"Stalled"}]}`)
	patch, err := statusPatch(was, now)
	must(t, err)
	want := `{"status":{"association":{"cluster":"a","id":null},"conditions":[{"type":"Ready"},{"type":"Stalled"}],"count":0,"gone":null,"name":""}}`
	if string(patch) != want {
		t.Errorf("patch\n%s\nwant\n%s", patch, want)
	}
}

// TestWriteAnnotationsWritesOnlyChangesAndCountsEveryError: against a real API server, a status
// kept in annotations is written in one patch when it changed and not at all when it did not; an
// Event marks a new reason only; a transient error is counted every time it is reported, written
// or not (the namespaces controller's errors once went uncounted). Not parallel: it reads the
// process's error counter.
func TestWriteAnnotationsWritesOnlyChangesAndCountsEveryError(t *testing.T) {
	ctx := context.Background()
	counted, requests := testenv.Counting(env.Config)
	c, err := client.New(counted, client.Options{Scheme: manager.Scheme()})
	must(t, err)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace(t), Name: "request"}}
	must(t, c.Create(ctx, cm))
	recorder := events.NewFakeRecorder(10)
	step := Step{Client: c, Recorder: recorder}
	report := func(current *corev1.ConfigMap, reason string, o Outcome) *corev1.ConfigMap {
		t.Helper()
		want := current.DeepCopy()
		want.Annotations = map[string]string{"status": reason}
		requests.Reset()
		must(t, step.WriteAnnotations(ctx, current, want, current.Annotations["status"], o))
		return want
	}
	errors := func() float64 {
		m := &dto.Metric{}
		must(t, reconcileErrors.WithLabelValues("ConfigMap", "Error").Write(m))
		return m.GetCounter().GetValue()
	}
	failed := Transient("Error", "the API server did not answer", context.DeadlineExceeded)

	was := errors()
	stored := report(cm, "Error", failed)
	if requests.Writes() != 1 || len(recorder.Events) != 1 || errors() != was+1 {
		t.Fatalf("a new status: %d writes (%v), %d Events, %v errors counted; want 1, 1, 1", requests.Writes(), requests.Log(), len(recorder.Events), errors()-was)
	}
	<-recorder.Events
	report(stored, "Error", failed)
	if requests.Total() != 0 || len(recorder.Events) != 0 || errors() != was+2 {
		t.Errorf("the same error again: %d requests (%v), %d Events, %v errors counted; want 0, 0, 2", requests.Total(), requests.Log(), len(recorder.Events), errors()-was)
	}
	got := &corev1.ConfigMap{}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(cm), got))
	if got.Annotations["status"] != "Error" {
		t.Errorf("stored annotations %v", got.Annotations)
	}
}
