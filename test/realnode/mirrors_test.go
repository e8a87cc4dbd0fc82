//go:build e2e

package realnode

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/promtext"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// pauseProgram is the static program of the images the tests push upstream (hack/node-image/pause):
// a container of them runs until it is stopped.
var pauseProgram = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "qm-real-pause")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./hack/node-image/pause")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./hack/node-image/pause: %w\n%s", err, out)
	}
	return os.ReadFile(bin)
})

// TestKubeletPullsThroughTheMirror is the mirror's whole purpose on a real node: an upstream that
// needs credentials, reachable from the node; a RegistryMirror whose cache StatefulSet runs on
// volumes of the cluster's default StorageClass (dynamically provisioned, and this provisioner
// ignores fsGroup) and whose agent DaemonSet writes the node's hosts.toml through its hostPath;
// then a Pod with no pull secret whose image lives only on the upstream starts: the kubelet pulls it
// through the cache, which fetched each blob from the upstream once. With the upstream stopped and
// the image removed from the node, a new Pod of it starts from the cache alone.
func TestKubeletPullsThroughTheMirror(t *testing.T) {
	ctx := context.Background()
	const user, password = "puller", "real-node-pull-secret"
	up := upstreamregistry.Serve(t, cluster.HostIP, user, password)
	program, err := pauseProgram()
	must(t, err)
	_, err = up.Pusher().PushRunnable(ctx, "team/app", "v1", program, "/pause")
	must(t, err)
	up.Requests()
	image := up.Host + "/team/app:v1"

	creds := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: mirrorsNamespace, Name: "real-upstream-pull"},
		StringData: map[string]string{mirror.UsernameKey: user, mirror.PasswordKey: password},
	}
	must(t, admin.Create(ctx, creds))
	t.Cleanup(func() { _ = admin.Delete(ctx, creds) })
	rm := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: "real-upstream"},
		Spec: registryv1alpha1.RegistryMirrorSpec{
			UpstreamURL: up.URL, CredentialsSecret: creds.Name, Replicas: ptr.To[int32](2),
			Storage:        &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("1Gi"))},
			DeletionPolicy: registryv1alpha1.DeletionPolicyDelete,
		},
	}
	must(t, admin.Create(ctx, rm))
	t.Cleanup(func() { _ = admin.Delete(ctx, rm) })
	t.Cleanup(func() { logPodsIfFailed(t, mirrorsNamespace, mirror.Labels(rm.Name, mirror.ComponentCache)) })
	waitMirrorReady(t, rm)
	// The cache pods find each other through the headless Service's SRV records (CoreDNS), looked
	// up every 5 s: until then each acts alone.
	start := time.Now()
	waitPeersKnown(t, rm, 2)
	t.Logf("the cache pods knew each other %s after the mirror was Ready", time.Since(start).Round(100*time.Millisecond))

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
		return meta.IsStatusConditionTrue(rm.Status.Conditions, "Ready")
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

// logPodsIfFailed logs the last lines of each container of the selected pods when the test failed.
func logPodsIfFailed(t *testing.T, namespace string, labels map[string]string) {
	if !t.Failed() {
		return
	}
	pods := &corev1.PodList{}
	if err := admin.List(context.Background(), pods, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
		t.Logf("listing pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
			b, err := kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: ptr.To[int64](40)}).DoRaw(context.Background())
			if err != nil {
				b = []byte(err.Error())
			}
			t.Logf("--- %s/%s (last 40 lines)\n%s", p.Name, c.Name, b)
		}
	}
}
