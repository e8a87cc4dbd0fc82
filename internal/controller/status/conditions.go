package status

import (
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// ConditionsOf is obj's status.conditions: every Quartermaster kind keeps them there, as do the
// NimbusPolicies the intents controller makes (nil for a kind without).
func ConditionsOf(obj client.Object) []metav1.Condition {
	v := reflect.Indirect(reflect.ValueOf(obj))
	if v.Kind() != reflect.Struct {
		return nil
	}
	if v = reflect.Indirect(v.FieldByName("Status")); v.Kind() != reflect.Struct {
		return nil
	}
	if v = v.FieldByName("Conditions"); !v.IsValid() {
		return nil
	}
	conds, _ := v.Interface().([]metav1.Condition)
	return conds
}

// ReadyOf is obj's Ready condition without its transition time (nil when it has none): what a
// watch on a dependent compares.
func ReadyOf(obj client.Object) *metav1.Condition {
	c := meta.FindStatusCondition(ConditionsOf(obj), Ready)
	if c == nil {
		return nil
	}
	out := *c
	out.LastTransitionTime = metav1.Time{}
	return &out
}

// ReadyChanged passes the updates of an object that change its Ready condition (status, reason,
// message or the generation observed), and nothing else: a watch adds creations and deletions
// where it wants them. An owner Ready when its dependents are watches them through it.
func ReadyChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return false },
		DeleteFunc: func(event.DeleteEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return !equality.Semantic.DeepEqual(ReadyOf(e.ObjectOld), ReadyOf(e.ObjectNew))
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// SetConditions writes the outcome into conds for generation: Ready (True only when o.Ready),
// Reconciling while the object is neither ready nor stalled, Stalled while it waits for a person.
// All three carry o's reason and message, so `kubectl get -o wide` and kstatus agree.
func SetConditions(conds *[]metav1.Condition, generation int64, o Outcome) {
	set := func(t string, ok bool) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(conds, metav1.Condition{
			Type: t, Status: s, Reason: o.Reason, Message: o.Message, ObservedGeneration: generation,
		})
	}
	set(Ready, o.Ready)
	if !o.Ready && !o.Stalled {
		set(Reconciling, true)
	} else {
		meta.RemoveStatusCondition(conds, Reconciling)
	}
	if o.Stalled {
		set(Stalled, true)
	} else {
		meta.RemoveStatusCondition(conds, Stalled)
	}
}

// ReadyReason is the reason of the Ready condition in conds, or "" when there is none.
func ReadyReason(conds []metav1.Condition) string {
	if c := meta.FindStatusCondition(conds, Ready); c != nil {
		return c.Reason
	}
	return ""
}

// Announce records an Event for o when its reason differs from the previous one (transitions
// only, never at every retry), unless o is Quiet: Normal when Ready, Warning otherwise, or
// o.EventType. A transient error counts in quartermaster_reconcile_errors_total, every time.
func Announce(rec events.EventRecorder, obj runtime.Object, previousReason string, o Outcome) {
	countError(obj, o)
	if o.Quiet || o.Reason == previousReason {
		return
	}
	typ := o.EventType
	switch {
	case typ != "":
	case o.Ready:
		typ = corev1.EventTypeNormal
	default:
		typ = corev1.EventTypeWarning
	}
	rec.Eventf(obj, nil, typ, o.Reason, "Reconcile", "%s", o.Message)
}
