package intent

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// InForce reports whether an engine has taken a stored policy of its kind in, and otherwise the
// engine's own words. Kyverno reports it in a Policy's or ClusterPolicy's status
// (KyvernoPolicyStatus); an engine that reports nothing (KubeArmor, NetworkPolicy) has it once it
// exists. A policy Kyverno cannot enforce at all is refused when it is written (its admission
// webhook), not reported here.
func InForce(obj *unstructured.Unstructured) (bool, string) {
	gvk := obj.GroupVersionKind()
	if gvk != KyvernoPolicyKind && gvk != KyvernoClusterPolicyKind {
		return true, ""
	}
	return KyvernoPolicyStatus(obj.Object)
}
