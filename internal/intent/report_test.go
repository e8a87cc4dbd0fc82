package intent

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// kyvernoReport is a report as Kyverno 1.19.1's reports controller writes one (fields from its
// PolicyReport of a Pod): a failed result with a long message, a pass, a skip under an exception.
func kyvernoReport() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
		"metadata": map[string]any{"name": "9b1c", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
			"labels":        map[string]any{"app.kubernetes.io/managed-by": "kyverno"},
			"managedFields": []any{map[string]any{"manager": "reports-controller"}}},
		"scope":   map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "p1"},
		"summary": map[string]any{"fail": int64(1), "pass": int64(1)},
		"results": []any{
			map[string]any{"policy": "shop/web-escapetohost", "rule": "pod-security-standard", "result": "fail", "message": strings.Repeat("x", 400),
				"source": "kyverno", "scored": true, "timestamp": map[string]any{"seconds": int64(1)}, "properties": map[string]any{"process": "background scan"}},
			map[string]any{"policy": "require-labels", "rule": "check", "result": "pass", "message": "ok", "source": "kyverno"},
			map[string]any{"policy": "shop/api-escapetohost", "rule": "pod-security-standard", "result": "skip", "source": "kyverno",
				"message":    "rule is skipped due to policy exception kyverno-exceptions/shop.legacy",
				"properties": map[string]any{"process": "background scan", "exceptions": "shop.legacy"}},
		},
	}}
}

func TestCompactReport(t *testing.T) {
	t.Parallel()
	u := CompactReport(kyvernoReport())
	if _, ok := u.Object["summary"]; ok || u.GetManagedFields() != nil || u.GetLabels() != nil {
		t.Errorf("compacted report keeps more than it reads: %v", u.Object)
	}
	if u.GetName() != "9b1c" || u.GetNamespace() != "shop" || u.GetUID() != "u1" || u.GetResourceVersion() != "7" || u.GetKind() != "PolicyReport" {
		t.Errorf("compacted report's identity: %v", u.Object)
	}
	if w := ReportWorkload(u); w != (intentv1alpha1.ImpactedWorkload{Namespace: "shop", Kind: "Pod", Name: "web-1"}) {
		t.Errorf("workload %+v", w)
	}
	want := []ReportResult{
		{Policy: "shop/web-escapetohost", Outcome: "fail", Rule: "pod-security-standard", Message: strings.Repeat("x", ReportMessageMax-3) + "..."},
		{Policy: "require-labels", Outcome: "pass"},
		{Policy: "shop/api-escapetohost", Outcome: "skip", Exceptions: "shop.legacy"},
	}
	if got := ReportResults(u); !slices.Equal(got, want) {
		t.Errorf("results\n got %+v\nwant %+v", got, want)
	}
	if all, failing := ReportPolicies(u, false), ReportPolicies(u, true); strings.Join(all, ",") != "shop/web-escapetohost,require-labels,shop/api-escapetohost" ||
		strings.Join(failing, ",") != "shop/web-escapetohost" {
		t.Errorf("policies %v, failing %v", all, failing)
	}
}

func TestReportWorkloadOfAScopeWithoutNamespace(t *testing.T) {
	t.Parallel()
	r := kyvernoReport()
	delete(r.Object["scope"].(map[string]any), "namespace")
	if w := ReportWorkload(CompactReport(r)); w.Namespace != "shop" {
		t.Errorf("a scope without namespace reads as namespace %q, want the report's own", w.Namespace)
	}
}

func TestSameVerdicts(t *testing.T) {
	t.Parallel()
	result := func(r *unstructured.Unstructured, i int) map[string]any {
		return r.Object["results"].([]any)[i].(map[string]any)
	}
	for _, tc := range []struct {
		name   string
		change func(r *unstructured.Unstructured)
		same   bool
	}{
		{"a rescan that changes only timestamps", func(r *unstructured.Unstructured) {
			result(r, 0)["timestamp"] = map[string]any{"seconds": int64(2)}
			r.SetResourceVersion("8")
		}, true},
		{"results in another order", func(r *unstructured.Unstructured) {
			rs := r.Object["results"].([]any)
			rs[0], rs[2] = rs[2], rs[0]
		}, true},
		{"a passed result's message", func(r *unstructured.Unstructured) { result(r, 1)["message"] = "fine" }, true},
		{"a pass turned fail", func(r *unstructured.Unstructured) { result(r, 1)["result"] = "fail" }, false},
		// The exception's exempted count changes.
		{"a pass turned skip", func(r *unstructured.Unstructured) { result(r, 1)["result"] = "skip" }, false},
		{"a skip under another exception", func(r *unstructured.Unstructured) {
			result(r, 2)["properties"] = map[string]any{"exceptions": "shop.other"}
		}, false},
		{"a failed result's message", func(r *unstructured.Unstructured) { result(r, 0)["message"] = "other" }, false},
		{"another resource", func(r *unstructured.Unstructured) { r.Object["scope"].(map[string]any)["name"] = "web-2" }, false},
		{"a result fewer", func(r *unstructured.Unstructured) { r.Object["results"] = r.Object["results"].([]any)[:2] }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			changed := kyvernoReport()
			tc.change(changed)
			if got := SameVerdicts(CompactReport(kyvernoReport()), CompactReport(changed)); got != tc.same {
				t.Errorf("SameVerdicts = %v, want %v", got, tc.same)
			}
		})
	}
}

// FuzzCompactReport reads arbitrary JSON as a report: whoever may write reports writes what the
// intents read, so no field of any type makes them panic, a compacted report reads the same when
// compacted again, and no message kept is over ReportMessageMax or invalid UTF-8.
func FuzzCompactReport(f *testing.F) {
	seed, _ := json.Marshal(kyvernoReport().Object)
	f.Add(seed)
	f.Add([]byte(`{"scope":"x","results":[1,"a",{"policy":2,"result":"fail","message":"\xff\xfe"}]}`))
	f.Add([]byte(`{"results":{"policy":"p"},"metadata":{"namespace":"n"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		obj := map[string]any{}
		if json.Unmarshal(data, &obj) != nil {
			return
		}
		u := CompactReport(&unstructured.Unstructured{Object: obj})
		again := CompactReport(u.DeepCopy())
		if !SameVerdicts(u, again) {
			t.Errorf("compacting twice changes the verdicts: %v", u.Object)
		}
		_ = ReportWorkload(u)
		_ = ReportPolicies(u, true)
		for _, r := range ReportResults(u) {
			if len(r.Message) > ReportMessageMax || !utf8.ValidString(r.Message) {
				t.Errorf("kept message %q", r.Message)
			}
		}
	})
}
