package intent

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Verdict is what an engine says of a generated policy.
type Verdict int

// The verdicts.
const (
	// Accepted: the engine has taken the policy in (Kyverno: its Ready condition is True), or the
	// engine reports nothing and its existing is all there is to know (KubeArmor, NetworkPolicy).
	Accepted Verdict = iota
	// Pending: the engine has not said yet.
	Pending
	// Refused: the engine said it cannot enforce the policy (Kyverno: Ready False), with why.
	Refused
)

// EngineVerdict reads an engine's verdict on a stored policy of its kind, and the engine's own
// message when it refused it. Kyverno (1.9 and newer) keeps a Ready condition in a Policy's and a
// ClusterPolicy's status: True once the policy is in its webhooks, False with the reason when it
// cannot be (a rule it cannot compile, a kind it cannot find).
func EngineVerdict(obj *unstructured.Unstructured) (Verdict, string) {
	gvk := obj.GroupVersionKind()
	if gvk != KyvernoPolicyKind && gvk != KyvernoClusterPolicyKind {
		return Accepted, ""
	}
	conditions, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conditions {
		cond, _ := c.(map[string]any)
		if cond["type"] != "Ready" {
			continue
		}
		msg, _ := cond["message"].(string)
		switch cond["status"] {
		case "True":
			return Accepted, msg
		case "False":
			return Refused, msg
		}
	}
	return Pending, ""
}
