package status

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// WriteTimeout bounds a status write. The write is made even when the reconcile's own context has
// ended (a reconcile that ran out of time still reports why).
const WriteTimeout = 10 * time.Second

// Step ends every reconcile: the one way a controller reports (End), and writes a status it
// changed on the way (Write; WriteAnnotations for a kind whose status is its annotations).
type Step struct {
	// Client writes the status subresource: the controller's guarded client (NewClient), so the
	// next reconcile reads what was written.
	Client   client.Client
	Recorder events.EventRecorder
}

// Reported is where an object's status keeps what every controller reports: its conditions and
// the generation they describe.
type Reported struct {
	Conditions         *[]metav1.Condition
	ObservedGeneration *int64
}

// End concludes a reconcile of obj, read as before when the reconcile began: the outcome goes into
// the conditions at obj's generation (Conclude: an Event when the Ready reason changes), the status
// is written (Write: one patch, only when it changed), and the workqueue gets the outcome's
// Result. A failed write is returned instead, so the workqueue retries.
func (s Step) End(ctx context.Context, obj, before client.Object, r Reported, o Outcome) (reconcile.Result, error) {
	s.Conclude(obj, r, o)
	if err := s.Write(ctx, obj, before); err != nil {
		return reconcile.Result{}, err
	}
	return o.Result()
}

// Conclude is End's first half, for a reconcile that concludes in several places and writes once
// at its end (a VmGroup's): the outcome in the conditions at obj's generation, observedGeneration
// set, an Event when the Ready reason changes.
func (s Step) Conclude(obj client.Object, r Reported, o Outcome) {
	*r.ObservedGeneration = obj.GetGeneration()
	previous := ReadyReason(*r.Conditions)
	SetConditions(r.Conditions, obj.GetGeneration(), o)
	Announce(s.Recorder, obj, previous, o)
}

// Write writes obj's status when it differs from before's: one JSON merge patch of the status
// subresource (statusPatch) without a resourceVersion (what else changed on the object since
// before, a finalizer patch for one, neither matters nor conflicts), within WriteTimeout.
// An object deleted meanwhile has nothing to report to.
func (s Step) Write(ctx context.Context, obj, before client.Object) error {
	was, err := statusJSON(before)
	if err != nil {
		return err
	}
	now, err := statusJSON(obj)
	if err != nil {
		return err
	}
	if bytes.Equal(was, now) {
		return nil
	}
	patch, err := statusPatch(was, now)
	if err != nil {
		return fmt.Errorf("the status patch of %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), WriteTimeout)
	defer cancel()
	return client.IgnoreNotFound(s.Client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)))
}

// WriteAnnotations is the step of a kind whose status is kept in its annotations (a namespace
// request's ConfigMap, the IAM compatibility mode's): want is current with the outcome's
// annotations set (and any owner reference the same write adds). It writes want when its
// annotations or owner references differ from current's, in one JSON merge patch without a
// resourceVersion (it names only what changed, so a stale copy does not make it fail), within
// WriteTimeout, and announces o every time (Announce: an Event when the reason changed from
// previousReason, an error counted). current must be read through the guarded client (NewClient),
// never older than this step's last write.
func (s Step) WriteAnnotations(ctx context.Context, current, want client.Object, previousReason string, o Outcome) error {
	if !maps.Equal(current.GetAnnotations(), want.GetAnnotations()) ||
		!equality.Semantic.DeepEqual(current.GetOwnerReferences(), want.GetOwnerReferences()) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), WriteTimeout)
		defer cancel()
		if err := s.Client.Patch(ctx, want, client.MergeFrom(current)); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	Announce(s.Recorder, current, previousReason, o)
	return nil
}

// statusJSON is obj's status as the API server would store it (its JSON; Go's encoder sorts map
// keys, so equal statuses have equal bytes).
func statusJSON(obj client.Object) (json.RawMessage, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var parts struct {
		Status json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return nil, err
	}
	if parts.Status == nil {
		return json.RawMessage("{}"), nil
	}
	return parts.Status, nil
}

func wrapStatus(s json.RawMessage) []byte {
	return append(append([]byte(`{"status":`), s...), '}')
}

// statusPatch is the merge patch that makes the stored status now, when it was was: all of now
// (a field whose value did not change is sent too: the stored object may lack it, a status never
// written, and a schema may require it even when it is zero), and null for each field was has
// and now does not (which the diff of the two says).
func statusPatch(was, now json.RawMessage) ([]byte, error) {
	diff, err := jsonpatch.CreateMergePatch(wrapStatus(was), wrapStatus(now))
	if err != nil {
		return nil, err
	}
	var full, removed map[string]any
	if err := json.Unmarshal(wrapStatus(now), &full); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(diff, &removed); err != nil {
		return nil, err
	}
	addNulls(full, removed)
	return json.Marshal(full)
}

// addNulls sets in full each null of diff, at its path: the fields removed.
func addNulls(full, diff map[string]any) {
	for k, v := range diff {
		switch d := v.(type) {
		case nil:
			full[k] = nil
		case map[string]any:
			if sub, ok := full[k].(map[string]any); ok {
				addNulls(sub, d)
			}
		}
	}
}
