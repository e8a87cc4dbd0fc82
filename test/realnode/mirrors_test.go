//go:build e2e

package realnode

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/promtext"
	"github.com/quartermaster-dev/quartermaster/internal/testing/realcluster"
	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// TestKubeletPullsThroughTheMirror is the mirror's whole purpose on a real node: an upstream that
// needs credentials, reachable from the node; a RegistryMirror whose cache StatefulSet runs on
// volumes of the cluster's default StorageClass (dynamically provisioned, and this provisioner
// ignores fsGroup) and whose agent DaemonSet writes the node's hosts.toml through its hostPath;
// then a Pod with no pull secret whose image lives only on the upstream starts: the kubelet pulls it
// through the cache, which fetched each blob from the upstream once. With the upstream stopped and
// the image removed from the node, a new Pod of it starts from the cache alone.
func TestKubeletPullsThroughTheMirror(t *testing.T) {
	ctx := context.Background()
	m := newPrivateMirror(t, "real-upstream", 2)
	up, rm := m.up, m.rm
	image := m.push(t, "team/app", "v1")

	// The agent wrote the node's hosts.toml (in the node's /etc/containerd/certs.d) through its
	// hostPath, naming the cache's Service address.
	hosts, err := cluster.InNode(ctx, "cat", "/etc/containerd/certs.d/"+up.Host+"/hosts.toml")
	must(t, err)
	if !strings.Contains(string(hosts), rm.Status.Endpoint) {
		t.Fatalf("the node's hosts.toml does not name the cache at %s:\n%s", rm.Status.Endpoint, hosts)
	}

	ns := newNamespace(t, "real-mirror-pull")
	first := runImage(t, ns, "first", image)
	pulledByKubelet(t, first, image)
	seen := up.Requests()
	if n, direct := upstreamregistry.BlobGETs(seen, ""), upstreamregistry.BlobGETs(seen, "containerd/"); n != 2 || direct != 0 {
		t.Errorf("the upstream served %d blob GETs (%d to containerd directly), want 2 (config and layer, once each, to the cache): %v", n, direct, seen)
	}
	if served := cacheServed(t, rm); served < 3 {
		t.Errorf("the cache pods served %v GETs, want the manifest and both blobs", served)
	}

	// Upstream down, image gone from the node: the cache alone serves the next Pod.
	up.Stop()
	removeImage(t, image)
	second := runImage(t, ns, "second", image)
	pulledByKubelet(t, second, image)
}

// privateMirror is a RegistryMirror of a private upstream registry served on the node's link.
type privateMirror struct {
	up *upstreamregistry.Server
	rm *registryv1alpha1.RegistryMirror
}

// newPrivateMirror serves an upstream registry that needs credentials where the node reaches it,
// and makes a RegistryMirror name of it with replicas cache pods on the default StorageClass, its
// credentials in a Secret of the mirrors' namespace. It waits for the mirror to be Ready and its
// cache pods to know each other (their SRV records, through CoreDNS, are looked up every 5 s: until
// then each acts alone). Everything goes when the test ends.
func newPrivateMirror(t *testing.T, name string, replicas int32) *privateMirror {
	t.Helper()
	return newPrivateMirrorWith(t, name, replicas, nil)
}

// newPrivateMirrorWith is newPrivateMirror with before, when not nil, run once the upstream serves
// and before the mirror is created (it may push images and change the mirror's spec).
func newPrivateMirrorWith(t *testing.T, name string, replicas int32, before func(m *privateMirror, spec *registryv1alpha1.RegistryMirrorSpec)) *privateMirror {
	t.Helper()
	ctx := context.Background()
	user, password := "user-"+name, "secret-of-"+name
	up := upstreamregistry.Serve(t, cluster.HostIP, user, password)
	creds := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: mirrorsNamespace, Name: name + "-pull"},
		StringData: map[string]string{mirror.UsernameKey: user, mirror.PasswordKey: password},
	}
	must(t, admin.Create(ctx, creds))
	t.Cleanup(func() { _ = admin.Delete(ctx, creds) })
	rm := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: registryv1alpha1.RegistryMirrorSpec{
			UpstreamURL: up.URL, CredentialsSecret: creds.Name, Replicas: ptr.To(replicas),
			Storage:        &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("1Gi"))},
			DeletionPolicy: registryv1alpha1.DeletionPolicyDelete,
		},
	}
	if before != nil {
		before(&privateMirror{up: up, rm: rm}, &rm.Spec)
	}
	must(t, admin.Create(ctx, rm))
	t.Cleanup(func() { _ = admin.Delete(ctx, rm) })
	t.Cleanup(func() { logCachePodsIfFailed(t, mirror.Labels(rm.Name, mirror.ComponentCache)) })
	waitMirrorReady(t, rm)
	waitNodeReachesCache(t, rm)
	start := time.Now()
	waitPeersKnown(t, rm, int(replicas))
	t.Logf("the cache pods knew each other %s after the mirror was Ready", time.Since(start).Round(100*time.Millisecond))
	return &privateMirror{up: up, rm: rm}
}

// push pushes a runnable image (the pause program) as repo:tag and returns its reference.
func (m *privateMirror) push(t *testing.T, repo, tag string) string {
	t.Helper()
	program, err := realcluster.PauseProgram()
	must(t, err)
	_, err = m.up.Pusher().PushRunnable(context.Background(), repo, tag, program, "/pause")
	must(t, err)
	m.up.Requests() // the pushes are not what a test counts
	return m.up.Host + "/" + repo + ":" + tag
}

// waitMirrorReady waits for rm's Ready condition (failing at once, named, if a cache or agent Pod
// cannot start) and reloads it.
func waitMirrorReady(t *testing.T, rm *registryv1alpha1.RegistryMirror) {
	t.Helper()
	eventually(t, "RegistryMirror "+rm.Name+" to be Ready", func() bool {
		if err := stuckPods(context.Background(), mirrorsNamespace); err != nil {
			t.Fatalf("%v\nthe mirror says: %s", err, mirrorCondition(rm))
		}
		if admin.Get(context.Background(), client.ObjectKeyFromObject(rm), rm) != nil {
			return false
		}
		c := meta.FindStatusCondition(rm.Status.Conditions, "Ready")
		return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == rm.Generation
	})
}

// waitNodeReachesCache waits until the node reaches rm's cache through its Service (GET /v2/ from
// the node's network). Ready says the cache pods are ready and every node's containerd reads the
// file naming the Service; it does not yet say that kube-proxy on the node routes the Service's
// address, which lags the pods' readiness by up to a second: a pull in that second finds the
// address refused and containerd falls back to the upstream (issue #34's note).
func waitNodeReachesCache(t *testing.T, rm *registryv1alpha1.RegistryMirror) {
	t.Helper()
	eventually(t, "the node to reach the cache at "+rm.Status.Endpoint, func() bool {
		_, err := cluster.InNode(context.Background(), "curl", "-sf", "-o", "/dev/null", "--max-time", "2", rm.Status.Endpoint+mirror.ReadyPath)
		return err == nil
	})
}

func mirrorCondition(rm *registryv1alpha1.RegistryMirror) string {
	cur := &registryv1alpha1.RegistryMirror{}
	if err := admin.Get(context.Background(), client.ObjectKeyFromObject(rm), cur); err != nil {
		return err.Error()
	}
	if c := meta.FindStatusCondition(cur.Status.Conditions, "Ready"); c != nil {
		return fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
	}
	return "no Ready condition"
}

// runImage runs a Pod of image (no pull secret, pulled if not present) and waits for it to run.
func runImage(t *testing.T, ns, name, image string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	must(t, admin.Create(context.Background(), pod))
	eventually(t, "pod "+name+" to run", func() bool {
		if err := stuckPods(context.Background(), ns); err != nil {
			t.Fatal(err)
		}
		return admin.Get(context.Background(), client.ObjectKeyFromObject(pod), pod) == nil && pod.Status.Phase == corev1.PodRunning
	})
	return pod
}

// pulledByKubelet checks the kubelet's own Event: it pulled image for pod.
func pulledByKubelet(t *testing.T, pod *corev1.Pod, image string) {
	t.Helper()
	events, err := kube.CoreV1().Events(pod.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod.Name + ",reason=Pulled",
	})
	must(t, err)
	for _, e := range events.Items {
		if e.Source.Component == "kubelet" && strings.Contains(e.Message, "Successfully pulled image \""+image+"\"") {
			t.Logf("kubelet: %s", e.Message)
			return
		}
	}
	t.Fatalf("no kubelet Event of pulling %s for pod %s: %v", image, pod.Name, events.Items)
}

// removeImage deletes image from the node as an admin would (CRI RemoveImage): the next Pod of it
// must pull it again.
func removeImage(t *testing.T, image string) {
	t.Helper()
	images, conn, err := cluster.Images()
	must(t, err)
	defer conn.Close()
	_, err = images.RemoveImage(context.Background(), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	must(t, err)
	st, err := images.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	must(t, err)
	if st.Image != nil {
		t.Fatalf("%s is still on the node after RemoveImage", image)
	}
}

// waitPeersKnown waits until each of rm's n cache pods knows the n-1 others (its peers gauge).
func waitPeersKnown(t *testing.T, rm *registryv1alpha1.RegistryMirror, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("each of %d cache pods to know the others", n), func() bool {
		pods := cachePods(t, rm)
		if len(pods) != n {
			return false
		}
		for _, p := range pods {
			if cacheMetrics(t, &p)[`quartermaster_mirror_peers{state="up"}`] != float64(n-1) {
				return false
			}
		}
		return true
	})
}

func cachePods(t *testing.T, rm *registryv1alpha1.RegistryMirror) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	must(t, admin.List(context.Background(), pods, client.InNamespace(mirrorsNamespace), client.MatchingLabels(mirror.Labels(rm.Name, mirror.ComponentCache))))
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// cacheMetrics reads a cache pod's metrics port (plain HTTP to its Pod address, routed to the node).
func cacheMetrics(t *testing.T, p *corev1.Pod) map[string]float64 {
	t.Helper()
	resp, err := httpClient.Get("http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(mirror.MetricsPort)) + "/metrics")
	if err != nil {
		return nil // not serving yet
	}
	defer resp.Body.Close()
	m, err := promtext.Parse(resp.Body)
	must(t, err)
	return m
}

// cacheServed sums the GETs rm's cache pods answered 200.
func cacheServed(t *testing.T, rm *registryv1alpha1.RegistryMirror) float64 {
	t.Helper()
	total := 0.0
	for _, p := range cachePods(t, rm) {
		total += cacheMetrics(t, &p)[`quartermaster_mirror_http_requests_total{code="200",method="get"}`]
	}
	return total
}

// httpClient reads the cache pods' metrics (plain HTTP on their Pod addresses, routed to the node).
var httpClient = &http.Client{Timeout: 10 * time.Second}

// logCachePodsIfFailed logs, when the test failed, the selected mirror pods' cache metrics and the
// last lines of each of their containers.
func logCachePodsIfFailed(t *testing.T, labels map[string]string) {
	namespace := mirrorsNamespace
	if !t.Failed() {
		return
	}
	pods := &corev1.PodList{}
	if err := admin.List(context.Background(), pods, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
		t.Logf("listing pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		if p.Labels[mirror.LabelComponent] == mirror.ComponentCache && p.Status.PodIP != "" {
			var lines []string
			for k, v := range cacheMetrics(t, &p) {
				if strings.HasPrefix(k, "quartermaster_mirror_") && v != 0 {
					lines = append(lines, fmt.Sprintf("%s %v", k, v))
				}
			}
			slices.Sort(lines)
			t.Logf("--- %s metrics\n%s", p.Name, strings.Join(lines, "\n"))
		}
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			b, err := kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: ptr.To[int64](40)}).DoRaw(context.Background())
			if err != nil {
				b = []byte(err.Error())
			}
			t.Logf("--- %s/%s (last 40 lines)\n%s", p.Name, c.Name, b)
		}
	}
}

// TestMirrorStallsOnAVolumeItMayNotTake: a cache volume that already holds someone's data, owned by
// root (a static PersistentVolume), is not taken over by the storage init container: the mirror
// stalls, and its status and a Warning Event name the pod, the claim and the permission the cache
// lacks, as the init container wrote it on the node.
func TestMirrorStallsOnAVolumeItMayNotTake(t *testing.T) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "qm-real-volume")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o750))
	must(t, os.WriteFile(filepath.Join(dir, "someones-data"), []byte("keep"), 0o600))
	const class = "qm-real-static"
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "qm-real-taken"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
		},
	}
	must(t, admin.Create(ctx, pv))
	t.Cleanup(func() { _ = admin.Delete(ctx, pv) })
	rm := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: "real-taken"},
		Spec: registryv1alpha1.RegistryMirrorSpec{
			UpstreamURL: "http://" + net.JoinHostPort(cluster.HostIP, "1"), Replicas: ptr.To[int32](1),
			Storage:        &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To(class)},
			DeletionPolicy: registryv1alpha1.DeletionPolicyDelete,
		},
	}
	must(t, admin.Create(ctx, rm))
	t.Cleanup(func() { _ = admin.Delete(ctx, rm) })
	t.Cleanup(func() { logCachePodsIfFailed(t, mirror.Labels(rm.Name, mirror.ComponentCache)) })

	var c *metav1.Condition
	eventually(t, "the mirror to stall with CacheFailing", func() bool {
		if admin.Get(ctx, client.ObjectKeyFromObject(rm), rm) != nil {
			return false
		}
		c = meta.FindStatusCondition(rm.Status.Conditions, "Ready")
		return c != nil && c.Reason == "CacheFailing"
	})
	for _, want := range []string{
		"pod " + mirror.CacheName(rm.Name) + "-0", "PersistentVolumeClaim " + mirror.PVCName(rm.Name, 0),
		"init container storage exited 1", "is not writable by uid 65532 (gid 65532): it is owned by 0:0, mode 0750",
		"it already holds someones-data",
	} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Ready's message does not say %q:\n%s", want, c.Message)
		}
	}
	if !meta.IsStatusConditionTrue(rm.Status.Conditions, "Stalled") {
		t.Errorf("want Stalled: a person must act on the volume")
	}
	events, err := kube.EventsV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + rm.Name + ",reason=CacheFailing"})
	must(t, err)
	if len(events.Items) == 0 || events.Items[0].Type != corev1.EventTypeWarning || !strings.Contains(events.Items[0].Note, "mode 0750") {
		t.Errorf("want a Warning Event CacheFailing naming the volume's mode, got %v", events.Items)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "someones-data")); err != nil || string(data) != "keep" {
		t.Errorf("the volume's data changed: %q, %v", data, err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the volume's owner changed: %v", err)
	}
}

// TestMirrorScaledWhilePodsPull: the mirror's replicas go 2 → 3 → 1 while Pods whose images live
// only upstream are started: every Pod runs, every image pulled by the kubelet through the cache
// (none straight from the upstream: the Pods have no pull secret, and containerd's own requests are
// counted), and no blob fetched from the upstream more than twice (its old owner, its new one).
func TestMirrorScaledWhilePodsPull(t *testing.T) {
	ctx := context.Background()
	m := newPrivateMirror(t, "real-scaled", 2)
	up, rm := m.up, m.rm
	var images []string
	for i := range 6 {
		images = append(images, m.push(t, "team/scaled", fmt.Sprintf("v%d", i)))
	}

	ns := newNamespace(t, "real-mirror-scaled")
	var pods []*corev1.Pod
	start := func(i int) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("app-%d", i)},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers:                    []corev1.Container{{Name: "app", Image: images[i], ImagePullPolicy: corev1.PullIfNotPresent}},
			},
		}
		must(t, admin.Create(ctx, pod))
		pods = append(pods, pod)
	}
	scale := func(n int32) {
		must(t, admin.Patch(ctx, rm, client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, n))))
	}
	start(0)
	scale(3)
	start(1)
	start(2)
	waitMirrorReady(t, rm)
	start(3)
	scale(1)
	start(4)
	start(5)
	for i, pod := range pods {
		eventually(t, "pod "+pod.Name+" to run", func() bool {
			return admin.Get(ctx, client.ObjectKeyFromObject(pod), pod) == nil && pod.Status.Phase == corev1.PodRunning
		})
		pulledByKubelet(t, pod, images[i])
	}
	seen := up.Requests()
	if direct := upstreamregistry.BlobGETs(seen, "containerd/"); direct != 0 {
		t.Errorf("containerd fetched %d blobs from the upstream itself, want none", direct)
	}
	perBlob := map[string]int{}
	for _, r := range seen {
		if strings.HasPrefix(r.Request, "GET /v2/") && strings.Contains(r.Request, "/blobs/sha256:") && r.Status == http.StatusOK {
			perBlob[r.Request]++ // a 401 is the challenge a cache answers by asking again
		}
	}
	if len(perBlob) != 2*len(images) {
		t.Errorf("the upstream served %d distinct blobs, want every image's config and layer (%d)", len(perBlob), 2*len(images))
	}
	for blob, n := range perBlob {
		if n > 2 {
			t.Errorf("%s: fetched %d times from the upstream, want at most twice", blob, n)
		}
	}
	waitMirrorReady(t, rm)
	if rm.Status.ReadyReplicas != 1 {
		t.Errorf("ready replicas %d after scaling to 1", rm.Status.ReadyReplicas)
	}
}

// TestCachePodKilledMidPull: while the kubelet pulls a Pod's image through the mirror (the
// upstream holds the blobs, so the cache's fills wait), the cache pod filling them is killed
// (deleted with no grace period); the kubelet's pull still succeeds — containerd retries through
// the Service, and the remaining pod fills the blobs — with no pull secret on the node.
func TestCachePodKilledMidPull(t *testing.T) {
	ctx := context.Background()
	m := newPrivateMirror(t, "real-killed", 2)
	up, rm := m.up, m.rm
	image := m.push(t, "team/killed", "v1")

	release := up.HoldBlobs()
	t.Cleanup(release)
	ns := newNamespace(t, "real-mirror-killed")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	must(t, admin.Create(ctx, pod))
	// The pod whose fill waits on the upstream: kill it.
	var filling *corev1.Pod
	eventually(t, "a cache pod to fill a blob for the kubelet's pull", func() bool {
		for _, p := range cachePods(t, rm) {
			if cacheMetrics(t, &p)["quartermaster_mirror_fills_in_flight"] > 0 {
				filling = &p
				return true
			}
		}
		return false
	})
	must(t, admin.Delete(ctx, filling, client.GracePeriodSeconds(0)))
	t.Logf("killed %s mid-fill", filling.Name)
	release()
	eventually(t, "the Pod to run", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(pod), pod) == nil && pod.Status.Phase == corev1.PodRunning
	})
	pulledByKubelet(t, pod, image)
	if direct := upstreamregistry.BlobGETs(up.Requests(), "containerd/"); direct != 0 {
		t.Errorf("containerd fetched %d blobs from the upstream itself, want none (it has no credentials)", direct)
	}
}
