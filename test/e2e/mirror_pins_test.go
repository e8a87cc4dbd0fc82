//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/nodeagent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// expiredContent is the cache's own count of the manifests and blobs its ttl deleted.
const expiredContent = "quartermaster_mirror_expired_total"

// TestPinnedImageOutlivesItsTTLThroughContainerd: a Deployment scaled to zero names an image
// through the mirror's host; the manager, under its generated RBAC, pins it in the mirror's pins
// ConfigMap, which the cache reads as the kubelet mounts it, and warms (fetches before any node
// asks). A real containerd pulls that image (no blob from the upstream) and
// one no workload names; the mirror's ttl (2 s) passes and the unnamed image expires (the cache's
// own count); then, with the upstream down, containerd pulls the pinned image again from the
// cache, and the other one fails.
func TestPinnedImageOutlivesItsTTLThroughContainerd(t *testing.T) {
	parallel(t, mirrorsController)
	ctx := context.Background()
	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(registryv1alpha1.AddToScheme)})
	must(t, err)
	const user, password = "puller", "e2e-pins-secret"
	up := startPrivateRegistry(t, user, password)
	pinned := up.PushImage(t, "team/pinned", "v1")
	idle := up.PushImage(t, "team/idle", "v1")

	startManager(t, "--controllers=mirrors", "--health-probe-bind-address=0", "--mirrors-image=quartermaster:e2e")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "qm-e2e-pins"}}
	must(t, c.Create(ctx, ns))
	t.Cleanup(func() { _ = c.Delete(ctx, ns) })
	labels := map[string]string{"app": "pinned"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "pinned"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: pinned}}}}},
	}
	must(t, c.Create(ctx, deploy))
	// An image the cluster must be able to start cold, which the upstream does not have.
	absent := up.Host + "/team/absent:v1"
	rm := processMirror(t, c, "e2e-pins", up, user, password, func(s *registryv1alpha1.RegistryMirrorSpec) {
		s.TTL = &metav1.Duration{Duration: 2 * time.Second}
		s.Prefetch = []string{absent}
	})

	ref := strings.TrimPrefix(pinned, up.Host+"/")
	pins := &corev1.ConfigMap{}
	eventually(t, "the mirror's pins naming "+ref, func() bool {
		if c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.PinsName(rm.Name)}, pins) != nil {
			return false
		}
		p, err := mirror.ParsePins([]byte(pins.Data[mirror.PinsFile]))
		_, ok := p.Images[ref]
		return err == nil && ok && len(p.Images) == 2
	})
	secret, sts := &corev1.Secret{}, &appsv1.StatefulSet{}
	ds, agentPods := &appsv1.DaemonSet{}, &corev1.PodList{}
	eventually(t, "the mirror's cache Secret, StatefulSet and an agent Pod", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.SecretName(rm.Name)}, secret) == nil &&
			len(secret.Data[mirror.PasswordKey]) > 0 &&
			c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.CacheName(rm.Name)}, sts) == nil &&
			c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.AgentName(rm.Name)}, ds) == nil &&
			c.List(ctx, agentPods, client.InNamespace(mirrorsNamespace), client.MatchingLabels{
				mirror.LabelMirror: rm.Name, mirror.LabelComponent: mirror.ComponentAgent}) == nil &&
			len(agentPods.Items) > 0 && agentPods.Items[0].Spec.NodeName != ""
	})
	got := &registryv1alpha1.RegistryMirror{}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(rm), got))
	if got.Status.PinnedImages != 2 {
		t.Errorf("status.pinnedImages %d, want 2", got.Status.PinnedImages)
	}

	cache := newCachePod(t, c, sts, secret)
	cache.start(t)
	node := startContainerd(t, registrySingleDir)
	startNodeAgent(t, ds, &agentPods.Items[0], node, cache.URL)
	waitNodeState(t, c, &agentPods.Items[0], "true", nodeagent.ReasonConfigured)
	if n := cache.metrics(t)["quartermaster_mirror_pinned_images"]; n != 2 {
		t.Errorf("the cache pins %v images, want 2", n)
	}

	// The cache fetched the pinned image before any node asked: containerd's pull of it takes no
	// blob from the upstream.
	eventually(t, "the cache to warm the pinned image", func() bool {
		return cache.metrics(t)[`quartermaster_mirror_pins_warmed_total{result="ok"}`] == 1
	})
	// The cache notes on its Pod, as the caches' ServiceAccount (under its RBAC and the admission
	// policy), the pins it read, what they take and the fetch that failed, with the upstream's answer.
	cachePod := &corev1.Pod{}
	var report mirror.CacheReport
	eventually(t, "the cache's note of its pins on its Pod", func() bool {
		if c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: sts.Name + "-0"}, cachePod) != nil {
			return false
		}
		var err error
		report, err = mirror.ParseCacheReport(cachePod.Annotations[mirror.AnnotationCacheReport])
		return err == nil && report.Warming == 0 && len(report.Failed) == 1 && report.Bytes > 0
	})
	if report.PinsHash != mirror.PinsHash([]byte(pins.Data[mirror.PinsFile])) || report.Pinned != 2 ||
		report.Failed[0].Image != "team/absent:v1" || !strings.Contains(report.Failed[0].Error, "404") {
		t.Errorf("the cache's note %s, want the pins ConfigMap's hash, 2 pinned, team/absent:v1 failed with the upstream's 404", report.Annotation())
	}
	before := cache.metrics(t)
	up.Requests()
	mustPullImage(t, node, pinned, nil)
	if seen := up.Requests(); upstreamregistry.BlobGETs(seen, "") != 0 {
		t.Errorf("the pull of the warmed image fetched %d blobs from the upstream, want none: %v", upstreamregistry.BlobGETs(seen, ""), seen)
	}
	mustPullImage(t, node, idle, nil)
	// The idle image's manifest, config and layer expire; nothing of the pinned one may.
	eventually(t, "the unpinned image to expire", func() bool {
		return cache.metrics(t)[expiredContent]-before[expiredContent] >= 3
	})
	if n := cache.metrics(t)[expiredContent] - before[expiredContent]; n != 3 {
		t.Errorf("%v manifests and blobs expired, want the idle image's 3", n)
	}

	up.Stop()
	node.remove(t, pinned)
	node.remove(t, idle)
	mustPullImage(t, node, pinned, nil)
	pctx, cancel := context.WithTimeout(ctx, uncachedPullBound)
	defer cancel()
	if err := node.pull(pctx, idle, nil); err == nil {
		t.Errorf("pulling %s, expired, with the upstream down succeeded", idle)
	}
}
