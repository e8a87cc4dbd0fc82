//go:build e2e

package realnode

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
)

// TestPinnedImageRestartsFromTheCacheAfterItsTTL: a Deployment scaled to zero names an image
// through a mirror whose ttl is 3 s; the kubelet mounts the mirror's pins ConfigMap in the cache
// pods, which read the pin. A Pod of that image runs (the kubelet pulls it through the cache), and
// the node's containerd pulls another image no workload names through the cache too. Once the
// unnamed image has expired in the caches, the upstream stops, the Pod and the image on the node go,
// and a new Pod of the pinned image starts: the kubelet pulls it from the cache alone, long after
// its ttl. The unnamed image cannot be pulled.
func TestPinnedImageRestartsFromTheCacheAfterItsTTL(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t, "real-mirror-pins")
	var image, idle string
	m := newPrivateMirrorWith(t, "real-pins", 1, func(m *privateMirror, spec *registryv1alpha1.RegistryMirrorSpec) {
		image, idle = m.push(t, "team/pinned", "v1"), m.push(t, "team/idle", "v1")
		spec.TTL = &metav1.Duration{Duration: 3 * time.Second}
		labels := map[string]string{"app": "pinned"}
		must(t, admin.Create(ctx, &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pinned"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: image}}}}},
		}))
	})
	rm := m.rm
	if rm.Status.PinnedImages != 1 {
		t.Errorf("status.pinnedImages %d, want 1", rm.Status.PinnedImages)
	}
	// The kubelet mounted the pins ConfigMap (or updates it at its next sync of the pod).
	eventually(t, "the cache pod to read its pin from the mounted ConfigMap", func() bool {
		pods := cachePods(t, rm)
		return len(pods) == 1 && cacheMetrics(t, &pods[0])["quartermaster_mirror_pinned_images"] == 1
	})
	// The cache pod warms it and notes so on its Pod with its own token (the chart's ServiceAccount,
	// RBAC and admission policy): the mirror says Warmed, with the size the image takes.
	eventually(t, "the mirror to say the pinned image is warmed", func() bool {
		must(t, admin.Get(ctx, client.ObjectKeyFromObject(rm), rm))
		c := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionWarmed)
		return c != nil && c.Status == metav1.ConditionTrue && rm.Status.PinnedSize != nil && !rm.Status.PinnedSize.IsZero()
	})

	first := runImage(t, ns, "first", image)
	pulledByKubelet(t, first, image)
	images, conn, err := cluster.Images()
	must(t, err)
	defer conn.Close()
	_, err = images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: idle}})
	must(t, err)
	pod := cachePods(t, rm)[0]
	eventually(t, "the unnamed image to expire in the cache", func() bool {
		return cacheMetrics(t, &pod)[expiredContent] >= 3
	})

	m.up.Stop()
	must(t, admin.Delete(ctx, first, &client.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	eventually(t, "the first Pod to go", func() bool {
		return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKeyFromObject(first), &corev1.Pod{}))
	})
	removeImage(t, image)
	removeImage(t, idle)
	second := runImage(t, ns, "second", image)
	pulledByKubelet(t, second, image)
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = images.PullImage(pctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: idle}})
	if err == nil {
		t.Errorf("pulling %s, expired, with the upstream down succeeded", idle)
	} else if !strings.Contains(err.Error(), "team/idle") {
		t.Logf("pulling the expired image failed: %v", err)
	}
}

// expiredContent is the cache's own count of the manifests and blobs its ttl deleted.
const expiredContent = "quartermaster_mirror_expired_total"
