package intent

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// serverDefaults are fields the engines' CRDs default when a generated object leaves them out;
// their presence in a stored object is not an edit.
var serverDefaults = map[string]any{
	"admission":              true, // Kyverno
	"skipBackgroundRequests": true, // Kyverno
	"background":             true, // Kyverno, where Nimbus leaves it out (the cluster cocoWorkload policy)
	// CronJob, Job and Pod defaults (assessTLS's CronJob).
	"concurrencyPolicy":             "Allow",
	"successfulJobsHistoryLimit":    int64(3),
	"failedJobsHistoryLimit":        int64(1),
	"dnsPolicy":                     "ClusterFirst",
	"schedulerName":                 "default-scheduler",
	"terminationGracePeriodSeconds": int64(30),
	"terminationMessagePath":        "/dev/termination-log",
	"terminationMessagePolicy":      "File",
	"defaultMode":                   int64(420),
	"serviceAccount":                K8TLSServiceAccount, // the deprecated copy of serviceAccountName
}

// Matches reports whether a stored engine object still says what the generated one says: its spec
// has every field the generated spec sets, with the same value, and nothing more than what the API
// server fills in (empty objects and the engines' defaults); its annotations include the generated
// ones and its controller is the generated owner. Anything else is a hand edit to revert.
func Matches(desired, actual *unstructured.Unstructured) bool {
	for _, field := range []string{"spec", "data"} { // data: a ConfigMap's
		if !covers(desired.Object[field], actual.Object[field]) {
			return false
		}
	}
	for k, v := range desired.GetLabels() {
		if actual.GetLabels()[k] != v {
			return false
		}
	}
	have := actual.GetAnnotations()
	for k, v := range desired.GetAnnotations() {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	want := desired.GetOwnerReferences()
	for _, ref := range actual.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller {
			return len(want) == 1 && ref.UID == want[0].UID && ref.Kind == want[0].Kind
		}
	}
	return false
}

func covers(desired, actual any) bool {
	switch d := desired.(type) {
	case map[string]any:
		a, ok := actual.(map[string]any)
		if !ok {
			return actual == nil && empty(d)
		}
		for k, v := range d {
			if !covers(v, a[k]) {
				return false
			}
		}
		for k, v := range a {
			if _, ok := d[k]; !ok && !empty(v) && !isDefault(k, v) {
				return false
			}
		}
		return true
	case []any:
		a, ok := actual.([]any)
		if !ok {
			return actual == nil && len(d) == 0
		}
		if len(a) != len(d) {
			return false
		}
		for i := range d {
			if !covers(d[i], a[i]) {
				return false
			}
		}
		return true
	case int64:
		return number(actual) == float64(d)
	case float64:
		return number(actual) == d
	default:
		return desired == actual
	}
}

func number(v any) float64 {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case float64:
		return n
	case int:
		return float64(n)
	}
	return -1
}

// empty is a value whose presence says nothing: nil, false, "", 0, an empty list, or an object of
// empty values.
func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case int64:
		return x == 0
	case float64:
		return x == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		for _, e := range x {
			if !empty(e) {
				return false
			}
		}
		return true
	}
	return false
}

func isDefault(key string, v any) bool {
	d, ok := serverDefaults[key]
	return ok && covers(d, v)
}
