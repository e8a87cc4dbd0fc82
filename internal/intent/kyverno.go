package intent

import (
	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// Pod security levels escapeToHost enforces (k8s.io/pod-security-admission's names).
const (
	PSABaseline   = "baseline"
	PSARestricted = "restricted"
)

// psaLevel is the rule's own psaLevel param (psa_level, the spelling of Nimbus's docs, too):
// restricted, or baseline by default. (Nimbus reads the first rule's params for every rule.)
func psaLevel(r intentv1alpha1.NimbusRules) string {
	for _, key := range []string{"psaLevel", "psa_level"} {
		if v := r.Rule.Params[key]; len(v) > 0 {
			if v[0] == PSARestricted {
				return PSARestricted
			}
			return PSABaseline
		}
	}
	return PSABaseline
}

// failureAction maps an intent's action to Kyverno's rule-level validate.failureAction (Kyverno
// 1.13 and newer; the spec-level validationFailureAction is deprecated): Block enforces, anything
// else audits.
func failureAction(action string) string {
	if action == intentv1alpha1.ActionBlock {
		return "Enforce"
	}
	return "Audit"
}

func kyvernoAnnotations(r intentv1alpha1.NimbusRules) map[string]any {
	return map[string]any{ManagedBy: "nimbus-kyverno", "policies.kyverno.io/description": r.Description}
}

// Kyverno's names of the kinds policies match.
const (
	podKind        = "v1/Pod"
	deploymentKind = "apps/v1/Deployment"
)

// kindResources are Kyverno's match resources for a kind, optionally in namespaces and by labels.
// The labels are one selector (all must match, as for the other engines; Nimbus writes one filter
// per label, which matches workloads carrying any of them).
func kindResources(kind string, namespaces []string, labels map[string]string) map[string]any {
	res := map[string]any{"kinds": []any{kind}}
	if len(namespaces) > 0 {
		res["namespaces"] = AnyList(namespaces)
	}
	if len(labels) > 0 {
		res["selector"] = map[string]any{"matchLabels": matchLabels(labels)}
	}
	return map[string]any{"resources": res}
}

// AnyList is ss as unstructured content holds a list of strings.
func AnyList(ss []string) []any {
	out := make([]any, 0, len(ss))
	for _, s := range ss {
		out = append(out, s)
	}
	return out
}

func podSecurityRule(r intentv1alpha1.NimbusRules, match, exclude map[string]any) map[string]any {
	rule := map[string]any{
		"name":  "pod-security-standard",
		"match": match,
		"validate": map[string]any{
			"failureAction": failureAction(r.Rule.RuleAction),
			"podSecurity":   map[string]any{"level": psaLevel(r), "version": "latest"},
		},
	}
	if exclude != nil {
		rule["exclude"] = exclude
	}
	return rule
}

// A rule carries exactly one operation block (validate, mutate or generate): Kyverno refuses a
// rule with two, and its CRD defaults fields into an empty one (validate.allowExistingViolations
// since 1.14), which would make an empty block a second operation. The rule-level fields
// (validate.failureAction, mutate.mutateExistingOnPolicyUpdate, generate.generateExisting) replace
// the spec-level ones Kyverno has deprecated.

// kyvernoPolicy is escapeToHost's Kyverno Policy: the pod security standard at the rule's
// psaLevel for the NimbusPolicy's pods.
func kyvernoPolicy(p parent, r intentv1alpha1.NimbusRules) Policy {
	name := PolicyName(p.name, r.ID)
	spec := map[string]any{
		"background": true,
		"rules":      []any{podSecurityRule(r, map[string]any{"any": []any{kindResources(podKind, nil, p.labels)}}, nil)},
	}
	obj := object(KyvernoPolicyKind, name, p.namespace, kyvernoAnnotations(r), p.owner, spec)
	return Policy{Engine: Kyverno, Object: obj, Entry: "KyvernoPolicy/" + name}
}

// kyvernoClusterPolicy is escapeToHost's Kyverno ClusterPolicy for a ClusterNimbusPolicy: its
// namespaces (never kube-system) and workloads.
func kyvernoClusterPolicy(cnp *intentv1alpha1.ClusterNimbusPolicy, owner map[string]any, r intentv1alpha1.NimbusRules) Policy {
	name := PolicyName(cnp.Name, r.ID)
	match, exclude := clusterSelection(cnp, podKind)
	spec := map[string]any{
		"background": true,
		"rules":      []any{podSecurityRule(r, match, exclude)},
	}
	obj := object(KyvernoClusterPolicyKind, name, "", kyvernoAnnotations(r), owner, spec)
	return Policy{Engine: Kyverno, Object: obj, Entry: "KyvernoClusterPolicy/" + name}
}
