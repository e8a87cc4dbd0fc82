package intent

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// A policy engine's report about one resource (Kyverno's wgpolicyk8s.io PolicyReport, one per
// scanned resource): the resource is its scope, and each policy rule that looked at it a result.
// The functions here read reports as an engine wrote them or as CompactReport kept them; a field of
// the wrong type reads as absent, never as a panic (reports are written by whoever may write them).

// ReportMessageMax is how much of a failed result's message a compacted report keeps.
const ReportMessageMax = 256

// ReportResult is one result of a report.
type ReportResult struct {
	Policy  string // the policy's key: "namespace/name" for a namespaced policy, "name" otherwise
	Outcome string // pass, fail, warn, error or skip
	// Rule and Message: kept of a failed result only in a compacted report.
	Rule, Message string
	// Exceptions: the engine's PolicyExceptions a skipped result was skipped under, comma-separated.
	Exceptions string
}

// Failed reports whether the result found the resource in violation (fail) or could not decide
// (error).
func (r ReportResult) Failed() bool { return r.Outcome == "fail" || r.Outcome == "error" }

// CompactReport is what the intents keep of a report (a cache holds one per scanned resource): its
// apiVersion, kind, namespace, name, UID and resourceVersion, its scope's kind, namespace, name and
// UID, and of each result its policy and outcome, with its rule and message (cut to
// ReportMessageMax) when it failed and its exceptions when it was skipped.
func CompactReport(u *unstructured.Unstructured) *unstructured.Unstructured {
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetNamespace(u.GetNamespace())
	out.SetName(u.GetName())
	out.SetUID(u.GetUID())
	out.SetResourceVersion(u.GetResourceVersion())
	if scope, ok := u.Object["scope"].(map[string]any); ok {
		kept := map[string]any{}
		for _, k := range []string{"kind", "namespace", "name", "uid"} {
			if v, ok := scope[k].(string); ok {
				kept[k] = v
			}
		}
		out.Object["scope"] = kept
	}
	results, _ := u.Object["results"].([]any)
	kept := make([]any, 0, len(results))
	for _, res := range results {
		m, ok := res.(map[string]any)
		if !ok {
			continue
		}
		r := readResult(m)
		c := map[string]any{"policy": r.Policy, "result": r.Outcome}
		if r.Failed() {
			c["rule"], c["message"] = r.Rule, cut(r.Message, ReportMessageMax)
		}
		if r.Outcome == "skip" {
			ex := r.Exceptions // as a compacted report keeps them: compacting again changes nothing
			if props, ok := m["properties"].(map[string]any); ok {
				if v, ok := props["exceptions"].(string); ok {
					ex = v
				}
			}
			if ex != "" {
				c["exceptions"] = ex
			}
		}
		kept = append(kept, c)
	}
	out.Object["results"] = kept
	return out
}

// cut is s cut to at most n bytes, ending in "..." when it was cut, valid UTF-8.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-3], "") + "..."
}

// readResult reads one result; its exceptions as a compacted report keeps them.
func readResult(m map[string]any) ReportResult {
	r := ReportResult{}
	r.Policy, _ = m["policy"].(string)
	r.Outcome, _ = m["result"].(string)
	r.Rule, _ = m["rule"].(string)
	r.Message, _ = m["message"].(string)
	r.Exceptions, _ = m["exceptions"].(string)
	return r
}

// ReportResults are the results of a compacted report.
func ReportResults(u *unstructured.Unstructured) []ReportResult {
	results, _ := u.Object["results"].([]any)
	out := make([]ReportResult, 0, len(results))
	for _, res := range results {
		m, _ := res.(map[string]any)
		out = append(out, readResult(m))
	}
	return out
}

// ReportWorkload is the resource a report is about (its scope; a namespaced report's own
// namespace when the scope names none).
func ReportWorkload(u *unstructured.Unstructured) intentv1alpha1.ImpactedWorkload {
	scope, _ := u.Object["scope"].(map[string]any)
	w := intentv1alpha1.ImpactedWorkload{}
	w.Namespace, _ = scope["namespace"].(string)
	w.Kind, _ = scope["kind"].(string)
	w.Name, _ = scope["name"].(string)
	if w.Namespace == "" {
		w.Namespace = u.GetNamespace()
	}
	return w
}

// ReportPolicies are the policies with a result in the report, each once in the order of their
// first result, or only those with a failed one.
func ReportPolicies(u *unstructured.Unstructured, failing bool) []string {
	var out []string
	for _, r := range ReportResults(u) {
		if r.Policy != "" && (!failing || r.Failed()) && !slices.Contains(out, r.Policy) {
			out = append(out, r.Policy)
		}
	}
	return out
}

// SameVerdicts reports whether two compacted reports say the same of the same resource: the
// policies with a result and its outcome, the failed ones' messages, the exceptions a skip was
// under (a rescan that changes only timestamps says the same).
func SameVerdicts(a, b *unstructured.Unstructured) bool {
	if ReportWorkload(a) != ReportWorkload(b) {
		return false
	}
	verdicts := func(u *unstructured.Unstructured) []string {
		var out []string
		for _, r := range ReportResults(u) {
			v := r.Policy + "\x00" + r.Outcome + "\x00" + r.Exceptions
			if r.Failed() {
				v += "\x00" + r.Message
			}
			out = append(out, v)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(verdicts(a), verdicts(b))
}
