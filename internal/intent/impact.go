package intent

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// An impact (status.impact of an intent, a binding or an exception) is what an engine's scans of
// the workloads that already run say about the policies an object stands for: how many of the
// scanned workloads fail them, which, and why.

// ScannedPolicy is one engine policy whose results make an impact.
type ScannedPolicy struct {
	Key   string // its key in the reports' results ("namespace/name", or "name" of a cluster policy)
	Entry string // as status.adapterPolicies lists it, e.g. KyvernoPolicy/name
}

// ImpactInputs is what an impact is made of.
type ImpactInputs struct {
	// Readable says whether the engine's reports can be read now; Why, when not, is the impact's
	// message.
	Readable bool
	Why      string
	// Policies are the scanned policies written; Pending those not written yet (their entries).
	Policies []ScannedPolicy
	Pending  []string
	// Unscanned are the intents no engine here scans, each "id (engines)".
	Unscanned []string
}

// AddUnscanned notes the intent id as one whose engines report nothing on existing workloads.
func (in *ImpactInputs) AddUnscanned(id string) {
	engines := slices.Concat(Implementations[id], ClusterImplementations[id])
	slices.Sort(engines)
	engines = slices.Compact(engines)
	note := id + " (" + JoinEngines(engines) + ")"
	if len(engines) == 0 {
		note = id + " (no engine)"
	}
	if !slices.Contains(in.Unscanned, note) {
		in.Unscanned = append(in.Unscanned, note)
	}
}

// KyvernoPolicyOf is where the Kyverno policy name, generated in namespace (a Policy) or for a
// ClusterNimbusPolicy (namespace ""), is found: the scanned policy, its kind, and the kind of its
// generating parent.
func KyvernoPolicyOf(namespace, name string) (p ScannedPolicy, kind schema.GroupVersionKind, parentKind string) {
	if namespace == "" {
		return ScannedPolicy{Key: name, Entry: "KyvernoClusterPolicy/" + name}, KyvernoClusterPolicyKind, "ClusterNimbusPolicy"
	}
	return ScannedPolicy{Key: namespace + "/" + name, Entry: "KyvernoPolicy/" + name}, KyvernoPolicyKind, "NimbusPolicy"
}

// Impact is the impact of in: nil when nothing is scanned or unscanned. reports(key) gives the
// reports that have results of the policy key; it is called only when in.Readable and nothing is
// pending, and its error is returned.
func Impact(in ImpactInputs, reports func(key string) ([]unstructured.Unstructured, error)) (*intentv1alpha1.Impact, error) {
	notScanned := ""
	if len(in.Unscanned) > 0 {
		unscanned := slices.Sorted(slices.Values(in.Unscanned))
		notScanned = strings.Join(unscanned, ", ") + " act on what runs from now on and report nothing on existing workloads"
	}
	if len(in.Policies) == 0 && len(in.Pending) == 0 {
		if notScanned == "" {
			return nil, nil
		}
		return &intentv1alpha1.Impact{State: intentv1alpha1.ImpactNotScanned, Message: notScanned}, nil
	}
	suffix := ""
	if notScanned != "" {
		suffix = "; not scanned: " + notScanned
	}
	if !in.Readable {
		return &intentv1alpha1.Impact{State: intentv1alpha1.ImpactUnknown, Message: in.Why + suffix}, nil
	}
	if len(in.Pending) > 0 {
		pending := slices.Sorted(slices.Values(in.Pending))
		return &intentv1alpha1.Impact{State: intentv1alpha1.ImpactUnknown,
			Message: "not written yet: " + strings.Join(pending, ", ") + suffix}, nil
	}
	scanned := map[string]bool{}
	violating := map[string]intentv1alpha1.ImpactedWorkload{}
	entries := make([]string, 0, len(in.Policies))
	var unreported []string
	for _, p := range in.Policies {
		entries = append(entries, p.Entry)
		items, err := reports(p.Key)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			unreported = append(unreported, p.Entry)
		}
		for i := range items {
			u := &items[i]
			w := ReportWorkload(u)
			id := w.Namespace + "/" + w.Kind + "/" + w.Name
			scanned[id] = true
			if _, done := violating[id]; done {
				continue
			}
			for _, r := range ReportResults(u) {
				if r.Policy == p.Key && r.Failed() {
					w.Policy, w.Message = p.Entry, r.Message
					violating[id] = w
					break
				}
			}
		}
	}
	ids := slices.Sorted(maps.Keys(violating))
	out := &intentv1alpha1.Impact{
		State:      intentv1alpha1.ImpactCurrent,
		Violations: ptr.To(int32(len(violating))), //nolint:gosec // a count of reports
		Scanned:    ptr.To(int32(len(scanned))),   //nolint:gosec // a count of reports
	}
	for _, id := range ids[:min(len(ids), intentv1alpha1.MaxImpactedWorkloads)] {
		out.Violating = append(out.Violating, violating[id])
	}
	slices.Sort(entries)
	slices.Sort(unreported)
	out.Unreported = unreported
	if len(unreported) > 0 {
		suffix = "; no report names " + strings.Join(unreported, ", ") + " yet (its scan has not reached it, or it selects nothing)" + suffix
	}
	out.Message = fmt.Sprintf("Kyverno's reports: %d of %d scanned workloads fail %s%s", len(violating), len(scanned), strings.Join(entries, ", "), suffix)
	return out, nil
}

// Exempted counts the workloads whose results for any of the policies were skipped under the
// engine's exception named exception; reports(key) as for Impact.
func Exempted(policies []ScannedPolicy, exception string, reports func(key string) ([]unstructured.Unstructured, error)) (int32, error) {
	seen := map[string]bool{}
	for _, p := range policies {
		items, err := reports(p.Key)
		if err != nil {
			return 0, err
		}
		for i := range items {
			u := &items[i]
			for _, res := range ReportResults(u) {
				if res.Policy == p.Key && res.Outcome == "skip" && slices.Contains(strings.Split(res.Exceptions, ","), exception) {
					w := ReportWorkload(u)
					seen[w.Namespace+"/"+w.Kind+"/"+w.Name] = true
				}
			}
		}
	}
	return int32(len(seen)), nil //nolint:gosec // a count of reports
}
