package namespaces

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A quota's usage, rewritten by the quota controller at every pod, neither sits in the cache nor
// wakes the request; a change to its spec or labels does.
func TestQuotaUsageDoesNotWakeTheRequest(t *testing.T) {
	t.Parallel()
	quota := func(rv, pods string) *corev1.ResourceQuota {
		return &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "quartermaster-defaults", Namespace: "n", ResourceVersion: rv,
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}},
			Spec:   corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")}},
			Status: corev1.ResourceQuotaStatus{Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse(pods)}},
		}
	}
	cached := func(q *corev1.ResourceQuota) *corev1.ResourceQuota {
		out, err := shareDefaults(q)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*corev1.ResourceQuota)
	}
	before, after := cached(quota("1", "1")), cached(quota("2", "2"))
	if len(after.Status.Used) != 0 || len(after.ManagedFields) != 0 {
		t.Errorf("cached quota keeps status %v or managedFields %v", after.Status, after.ManagedFields)
	}
	if contentChanged(before, after) {
		t.Error("a usage change (and a new resourceVersion) counts as a change")
	}
	// (Edited before it is cached: cached objects share their spec and are never changed.)
	edit := quota("3", "2")
	edit.Spec.Hard[corev1.ResourcePods] = resource.MustParse("1000")
	if edited := cached(edit); !contentChanged(after, edited) {
		t.Error("a spec edit does not count as a change")
	}
	relabel := quota("4", "2")
	relabel.Labels = map[string]string{"x": "y"}
	if relabelled := cached(relabel); !contentChanged(after, relabelled) {
		t.Error("a label change does not count as a change")
	}
}
