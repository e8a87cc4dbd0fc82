package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/promtext"
	"github.com/quartermaster-dev/quartermaster/internal/testing/realcluster"
	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// realImageBytes is the size of the random payload of each image the real-node case pulls: large
// enough that the pull, not the container's start, is most of a Pod's start.
const realImageBytes = 32 << 20

// realNodeBench runs on a real one-node cluster of its own (hack/real-cluster.sh; needs root): the
// chart installed with helm --wait (timed), then the start of a Pod (created → Running, the
// kubelet pulling its image) whose image comes straight from an upstream registry with a pull
// secret, against a Pod of an image of the same size pulled through a RegistryMirror of another
// upstream, cold (the cache fetches it) and warm (the image removed from the node, the cache has
// it). Each image is new to the node and the cache when its Pod starts. Then Kyverno as Pods
// (realNodeKyverno), the chart's intents controller writing for it.
func realNodeBench(ctx context.Context, _ *env) ([]result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the real node needs root (network namespaces, mounts, runc)")
	}
	name := clusterName + "-real"
	start := time.Now()
	c, err := realcluster.Up(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Down() }()
	up := time.Since(start)
	if err := c.LoadProjectImage("bench"); err != nil {
		return nil, err
	}
	values := filepath.Join(binDir, "real-values.yaml")
	if err := os.WriteFile(values, []byte("image: {repository: quartermaster, tag: bench, pullPolicy: Never}\nintents: {engines: kyverno}\n"), 0o600); err != nil {
		return nil, err
	}
	installed, err := c.InstallChart("quartermaster", "quartermaster-system", values)
	if err != nil {
		return nil, err
	}
	admin, err := client.New(c.Config, client.Options{Scheme: manager.Scheme(registryv1alpha1.AddToScheme, intentv1alpha1.AddToScheme)})
	if err != nil {
		return nil, err
	}

	program, err := realcluster.PauseProgram()
	if err != nil {
		return nil, err
	}
	payload := make([]byte, realImageBytes)
	const user, password = "bench", "bench-real-node-secret"
	mirrored, err := serveRegistry(ctx, c.HostIP, user, password)
	if err != nil {
		return nil, err
	}
	defer mirrored.close()
	direct, err := serveRegistry(ctx, c.HostIP, user, password)
	if err != nil {
		return nil, err
	}
	defer direct.close()
	// The direct upstream speaks plain HTTP, as the mirrored one does: the node's containerd is told
	// so in its own hosts.toml, as a cluster with an insecure registry would be configured.
	hosts := fmt.Sprintf("server = %q\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", direct.url, direct.url)
	if out, err := c.InNode(ctx, "sh", "-c", fmt.Sprintf("mkdir -p /etc/containerd/certs.d/%s && printf '%%b' %q > /etc/containerd/certs.d/%s/hosts.toml",
		direct.host, hosts, direct.host)); err != nil {
		return nil, fmt.Errorf("configuring the node for the direct upstream: %w\n%s", err, out)
	}
	push := func(r *benchRegistry, tag string) (string, error) {
		_, _ = rand.Read(payload)
		_, err := r.pusher.PushRunnable(ctx, "team/app", tag, append(append([]byte{}, program...), payload...), "/pause")
		return r.host + "/team/app:" + tag, err
	}
	directImage, err := push(direct, "v1")
	if err != nil {
		return nil, err
	}
	mirroredImage, err := push(mirrored, "v1")
	if err != nil {
		return nil, err
	}

	const ns, mirrorsNS = "bench-pulls", "quartermaster-mirrors"
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "direct-pull"}, Type: corev1.SecretTypeDockerConfigJson,
			StringData: map[string]string{corev1.DockerConfigJsonKey: fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q}}}`, direct.host, user, password)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mirrorsNS, Name: "bench-upstream"},
			StringData: map[string]string{mirror.UsernameKey: user, mirror.PasswordKey: password}},
		&registryv1alpha1.RegistryMirror{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: registryv1alpha1.RegistryMirrorSpec{
			UpstreamURL: mirrored.url, CredentialsSecret: "bench-upstream", Replicas: ptr.To[int32](2),
			Storage: &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("1Gi"))},
		}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			return nil, err
		}
	}
	if err := waitMirrorServing(ctx, admin, "bench"); err != nil {
		return nil, err
	}

	podStart := func(podName, image string, secret bool) (time.Duration, error) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: podName},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers:                    []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
			},
		}
		if secret {
			pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "direct-pull"}}
		}
		start := time.Now()
		if err := admin.Create(ctx, pod); err != nil {
			return 0, err
		}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			if err := c.StuckPods(ctx, ns); err != nil {
				return false, err
			}
			return admin.Get(ctx, client.ObjectKeyFromObject(pod), pod) == nil && pod.Status.Phase == corev1.PodRunning, nil
		})
		return time.Since(start), err
	}
	directTook, err := podStart("direct", directImage, true)
	if err != nil {
		return nil, fmt.Errorf("the direct pull: %w", err)
	}
	coldTook, err := podStart("mirror-cold", mirroredImage, false)
	if err != nil {
		return nil, fmt.Errorf("the cold pull through the mirror: %w", err)
	}
	images, conn, err := c.Images()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mirror-cold"}}); err != nil {
		return nil, err
	}
	// The image goes once its container is gone.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: mirroredImage}})
		return err == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("removing %s from the node: %w", mirroredImage, err)
	}
	warmTook, err := podStart("mirror-warm", mirroredImage, false)
	if err != nil {
		return nil, fmt.Errorf("the warm pull through the mirror: %w", err)
	}
	// A rollout after pre-warming: a Deployment's template (scaled to zero) names a new image; the
	// manager pins it, asks the cache pods' kubelet to hand them the pins, and the owner fetches
	// it: the mirror says Warmed. Then the rollout's first Pod pulls it.
	nextImage, err := push(mirrored, "v2")
	if err != nil {
		return nil, err
	}
	labels := map[string]string{"app": "next"}
	pinStart := time.Now()
	if err := admin.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "next"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: nextImage}}}}},
	}); err != nil {
		return nil, err
	}
	rm := &registryv1alpha1.RegistryMirror{}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := admin.Get(ctx, client.ObjectKey{Name: "bench"}, rm); err != nil {
			return false, err
		}
		w := meta.FindStatusCondition(rm.Status.Conditions, registryv1alpha1.ConditionWarmed)
		return rm.Status.PinnedImages == 2 && w != nil && w.Status == metav1.ConditionTrue, nil
	}); err != nil {
		return nil, fmt.Errorf("the mirror holding the new image: %w (status %+v)", err, rm.Status)
	}
	prewarmed := time.Since(pinStart)
	rolloutTook, err := podStart("next-first", nextImage, false)
	if err != nil {
		return nil, fmt.Errorf("the first Pod of the pre-warmed image: %w", err)
	}
	size := fmt.Sprintf("%d MiB image", (len(program)+realImageBytes)>>20)
	kyvernoResults, err := realNodeKyverno(ctx, c, admin)
	if err != nil {
		return nil, fmt.Errorf("kyverno as Pods: %w", err)
	}
	return append([]result{
		{metric: "real cluster up: node Ready, CoreDNS serving", value: up.Seconds(), unit: "s"},
		{metric: "helm install --wait: every workload Ready", value: installed.Seconds(), unit: "s", note: "manager 2 replicas, the chart's defaults, intents for Kyverno"},
		{metric: "Pod start, image straight from the upstream (pull secret)", value: directTook.Seconds(), unit: "s", note: size},
		{metric: "Pod start, image through the mirror, cold (the cache fetches it)", value: coldTook.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the direct pull", coldTook.Seconds()/directTook.Seconds())},
		{metric: "Pod start, image through the mirror, warm (removed from the node, in the cache)", value: warmTook.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the direct pull", warmTook.Seconds()/directTook.Seconds())},
		{metric: "a template names a new image: until the mirror holds it (Warmed)", value: prewarmed.Seconds(), unit: "s",
			note: "the pins written, the cache pods' kubelet asked to hand them over, the owner's fetch; the kubelet's periodic sync alone takes up to a minute"},
		{metric: "Pod start, the first of a rollout of the pre-warmed image", value: rolloutTook.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the warm Pod start (must be ≤ 1.2)", rolloutTook.Seconds()/warmTook.Seconds())},
	}, kyvernoResults...), nil
}

// waitMirrorServing waits until the mirror is Ready and each of its cache pods knows the others
// (their SRV records are looked up every 5 s; until then each acts alone).
func waitMirrorServing(ctx context.Context, c client.Client, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		rm := &registryv1alpha1.RegistryMirror{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, rm); err != nil || !meta.IsStatusConditionTrue(rm.Status.Conditions, "Ready") {
			return false, nil //nolint:nilerr // not there yet
		}
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace("quartermaster-mirrors"), client.MatchingLabels(mirror.Labels(name, mirror.ComponentCache))); err != nil {
			return false, nil //nolint:nilerr // the next look
		}
		for _, p := range pods.Items {
			resp, err := http.Get("http://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(mirror.MetricsPort)) + "/metrics")
			if err != nil {
				return false, nil //nolint:nilerr // not serving yet
			}
			m, err := promtext.Parse(resp.Body)
			resp.Body.Close()
			if err != nil || m[`quartermaster_mirror_peers{state="up"}`] != float64(len(pods.Items)-1) {
				return false, nil //nolint:nilerr // not yet
			}
		}
		return len(pods.Items) > 0, nil
	})
}

// benchRegistry is a private upstream registry served on the real node's link.
type benchRegistry struct {
	url, host string
	pusher    upstreamregistry.Pusher
	close     func()
}

func serveRegistry(ctx context.Context, hostIP, user, password string) (*benchRegistry, error) {
	dir, err := os.MkdirTemp(binDir, "registry")
	if err != nil {
		return nil, err
	}
	app, err := upstreamregistry.New(ctx, dir, user, password)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(hostIP, "0"))
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: app, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	r := &benchRegistry{host: ln.Addr().String(), close: func() { _ = srv.Close(); _ = app.Shutdown() }}
	r.url = "http://" + r.host
	r.pusher = upstreamregistry.Pusher{URL: r.url, User: user, Password: password}
	return r, nil
}
