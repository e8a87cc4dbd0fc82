package intent

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestInForce: Kyverno's kinds by their status (KyvernoPolicyStatus's table), the others by their
// existing.
func TestInForce(t *testing.T) {
	for _, tc := range []struct {
		apiVersion, kind string
		want             bool
	}{
		{"kyverno.io/v1", "Policy", false},
		{"kyverno.io/v1", "ClusterPolicy", false},
		{"networking.k8s.io/v1", "NetworkPolicy", true},
		{"security.kubearmor.com/v1", "KubeArmorPolicy", true},
	} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(tc.apiVersion)
		u.SetKind(tc.kind)
		if got, _ := InForce(u); got != tc.want {
			t.Errorf("%s without a status: InForce = %v, want %v", tc.kind, got, tc.want)
		}
	}
}
