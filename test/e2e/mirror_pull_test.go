//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/nodeagent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/promtext"
	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// A pull that works finishes well within this; it bounds a hang, it is no timing assertion.
const pullTimeout = 2 * time.Minute

// uncachedPullBound: a pull of what neither the cache nor a reachable upstream has must fail
// within it (the "fails within 10 s"): the context ends the wait, the test asserts that
// the pull failed by itself.
const uncachedPullBound = 10 * time.Second

// servedGETs is the cache's own count of the GETs it answered 200: manifests and blobs it served.
const servedGETs = `quartermaster_mirror_http_requests_total{code="200",method="get"}`

// The single-directory configuration docs/mirrors.md asks for, and containerd 2's default with
// the CRI pulling through its own resolver.
const (
	registrySingleDir = "[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n"
	registryLocalPull = "[plugins.\"io.containerd.cri.v1.images\"]\n  use_local_image_pull = true\n"
)

// TestContainerdPullsThroughTheMirror: a real containerd 2 pulls as a kubelet does (CRI
// PullImage) through a RegistryMirror's cache from an upstream that needs credentials. The
// manager renders the mirror's objects; the cache runs as a process with the args, env and
// mounted Secret of the rendered StatefulSet; the node agent, as a process with the DaemonSet's
// args, writes containerd's hosts.toml and reports on its Pod whether containerd reads it.
func TestContainerdPullsThroughTheMirror(t *testing.T) {
	parallel(t, mirrorsController)
	ctx := context.Background()
	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(registryv1alpha1.AddToScheme)})
	must(t, err)
	const user, password = "puller", "e2e-node-pull-secret"
	up := startPrivateRegistry(t, user, password)
	image := up.PushImage(t, "team/app", "v1")
	uncached := up.PushImage(t, "team/app", "v2") // never pulled before the upstream goes down
	kubeletAuth := &runtimeapi.AuthConfig{Username: user, Password: password}

	startManager(t, "--controllers=mirrors", "--health-probe-bind-address=0", "--mirrors-image=quartermaster:e2e")
	rm := processMirror(t, c, "e2e-node", up, user, password, nil)

	// What the controller rendered: the cache's Secret (with the credentials it checked against
	// the upstream), the StatefulSet that mounts it, and an agent Pod per node.
	secret, sts := &corev1.Secret{}, &appsv1.StatefulSet{}
	eventually(t, "the mirror's cache Secret with the credentials and its StatefulSet", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.SecretName(rm.Name)}, secret) == nil &&
			len(secret.Data[mirror.PasswordKey]) > 0 &&
			c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.CacheName(rm.Name)}, sts) == nil &&
			sts.Spec.Template.Annotations[mirror.AnnotationConfigHash] == mirror.ConfigHash(secret.Data)
	})
	ds, agentPods := &appsv1.DaemonSet{}, &corev1.PodList{}
	eventually(t, "an agent Pod on each node", func() bool {
		return c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.AgentName(rm.Name)}, ds) == nil &&
			c.List(ctx, agentPods, client.InNamespace(mirrorsNamespace), client.MatchingLabels{
				mirror.LabelMirror: rm.Name, mirror.LabelComponent: mirror.ComponentAgent}) == nil &&
			len(agentPods.Items) == 2 && agentPods.Items[0].Spec.NodeName != "" && agentPods.Items[1].Spec.NodeName != ""
	})

	cache := newCachePod(t, c, sts, secret)
	cache.start(t)
	hostsFile := func(node *containerdNode) string {
		return filepath.Join(node.Root, "etc", "containerd", "certs.d", up.Host, "hosts.toml")
	}

	t.Run("config_path one directory: pulls go through the cache", func(t *testing.T) {
		node := startContainerd(t, registrySingleDir)
		startNodeAgent(t, ds, &agentPods.Items[0], node, cache.URL)
		waitNodeState(t, c, &agentPods.Items[0], "true", nodeagent.ReasonConfigured)

		// Pulled through the cache with the cache's credentials: the kubelet gives none, and the
		// upstream sees every blob fetched by the cache, none by containerd.
		before := cache.metrics(t)
		up.Requests()
		mustPullImage(t, node, image, nil)
		seen := up.Requests()
		if served := cache.metrics(t)[servedGETs] - before[servedGETs]; served < 3 {
			t.Errorf("the cache served %v GETs for the pull, want the manifest, the config and the layer", served)
		}
		if n, direct := upstreamregistry.BlobGETs(seen, ""), upstreamregistry.BlobGETs(seen, "containerd/"); n != 2 || direct != 0 {
			t.Errorf("the upstream served %d blob GETs, %d of them to containerd; want 2, all to the cache: %v", n, direct, seen)
		}

		// The upstream down and the image gone from the node: the cache serves it.
		up.Stop()
		node.remove(t, image)
		before = cache.metrics(t)
		mustPullImage(t, node, image, nil)
		if served := cache.metrics(t)[servedGETs] - before[servedGETs]; served < 3 {
			t.Errorf("with the upstream down the cache served %v GETs, want the manifest and both blobs", served)
		}

		// Also after the cache restarts (on its volume), the upstream still down.
		cache.stop(t)
		cache.start(t)
		node.remove(t, image)
		before = cache.metrics(t)
		mustPullImage(t, node, image, nil)
		if served := cache.metrics(t)[servedGETs] - before[servedGETs]; served < 3 {
			t.Errorf("after a restart the cache served %v GETs, want the manifest and both blobs", served)
		}

		// A tag the cache never fetched cannot be had: the pull fails, and does not hang.
		pctx, cancel := context.WithTimeout(ctx, uncachedPullBound)
		err := node.pull(pctx, uncached, kubeletAuth)
		cancel()
		switch {
		case err == nil:
			t.Errorf("pulling %s, never cached, with the upstream down succeeded", uncached)
		case status.Code(err) == codes.DeadlineExceeded || errors.Is(pctx.Err(), context.DeadlineExceeded):
			t.Errorf("pulling %s, never cached, with the upstream down did not fail within %s: %v", uncached, uncachedPullBound, err)
		default:
			t.Logf("pulling %s, never cached, with the upstream down failed: %v", uncached, err)
		}

		// The cache down and the upstream back: containerd falls back to the upstream, with the
		// kubelet's credentials (an imagePullSecret).
		cache.stop(t)
		up.Start(t)
		node.remove(t, image)
		up.Requests()
		mustPullImage(t, node, image, kubeletAuth)
		if seen := up.Requests(); upstreamregistry.BlobGETs(seen, "containerd/") != 2 {
			t.Errorf("with the cache down containerd fetched %d blobs from the upstream, want 2: %v", upstreamregistry.BlobGETs(seen, "containerd/"), seen)
		}
		cache.start(t)
	})

	t.Run("containerd's default config_path: the agent says the node is not configured", func(t *testing.T) {
		node := startContainerd(t, "")
		startNodeAgent(t, ds, &agentPods.Items[1], node, cache.URL)
		p := waitNodeState(t, c, &agentPods.Items[1], "false", nodeagent.ReasonConfigPathIgnored)
		for _, want := range []string{
			`containerd 2's default "/etc/containerd/certs.d:/etc/docker/certs.d"`,
			`set config_path = "/etc/containerd/certs.d" under [plugins."io.containerd.cri.v1.images".registry]`,
			"use_local_image_pull = true",
		} {
			if msg := p.Annotations[nodeagent.AnnotationMessage]; !strings.Contains(msg, want) {
				t.Errorf("the agent's message %q does not say %q", msg, want)
			}
		}
		// The file is where containerd's list names it first, and containerd pulls past it
		// straight from the upstream: the agent was right.
		if _, err := os.Stat(hostsFile(node)); err != nil {
			t.Fatalf("the agent wrote no hosts.toml: %v", err)
		}
		before := cache.metrics(t)
		up.Requests()
		mustPullImage(t, node, image, kubeletAuth)
		if served := cache.metrics(t)[servedGETs] - before[servedGETs]; served != 0 {
			t.Errorf("the cache served %v GETs, want none: containerd 2 ignores hosts.toml with its default config_path", served)
		}
		if seen := up.Requests(); upstreamregistry.BlobGETs(seen, "containerd/") != 2 {
			t.Errorf("containerd fetched %d blobs from the upstream, want 2: %v", upstreamregistry.BlobGETs(seen, "containerd/"), seen)
		}
	})

	t.Run("containerd's default config_path with use_local_image_pull: pulls go through the cache", func(t *testing.T) {
		node := startContainerd(t, registryLocalPull)
		startNodeAgent(t, ds, &agentPods.Items[1], node, cache.URL)
		waitNodeState(t, c, &agentPods.Items[1], "true", nodeagent.ReasonConfigured)
		before := cache.metrics(t)
		up.Requests()
		mustPullImage(t, node, image, nil)
		if served := cache.metrics(t)[servedGETs] - before[servedGETs]; served < 3 {
			t.Errorf("the cache served %v GETs for the pull, want the manifest, the config and the layer", served)
		}
		if seen := up.Requests(); upstreamregistry.BlobGETs(seen, "") != 0 {
			t.Errorf("the upstream served blobs for an image the cache holds: %v", seen)
		}
	})
}

// processMirror creates a RegistryMirror of one cache pod for a cache run as a process (its claim
// is never bound: it goes with the mirror, or it would take a volume another test provides) of
// the private upstream up, with a credentials Secret for user and password, both deleted at the
// test's end; edit, if not nil, changes its spec first.
func processMirror(t *testing.T, c client.Client, name string, up *upstreamregistry.Server, user, password string, edit func(*registryv1alpha1.RegistryMirrorSpec)) *registryv1alpha1.RegistryMirror {
	t.Helper()
	ctx := context.Background()
	creds := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: mirrorsNamespace, Name: name + "-pull"},
		StringData: map[string]string{mirror.UsernameKey: user, mirror.PasswordKey: password},
	}
	must(t, c.Create(ctx, creds))
	t.Cleanup(func() { _ = c.Delete(ctx, creds) })
	rm := &registryv1alpha1.RegistryMirror{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: registryv1alpha1.RegistryMirrorSpec{
			UpstreamURL: up.URL, CredentialsSecret: creds.Name, Replicas: ptr.To[int32](1),
			Storage:        &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To("")},
			DeletionPolicy: registryv1alpha1.DeletionPolicyDelete,
		},
	}
	if edit != nil {
		edit(&rm.Spec)
	}
	must(t, c.Create(ctx, rm))
	t.Cleanup(func() { _ = c.Delete(ctx, rm) })
	return rm
}

func mustPullImage(t *testing.T, node *containerdNode, ref string, auth *runtimeapi.AuthConfig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pullTimeout)
	defer cancel()
	if err := node.pull(ctx, ref, auth); err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
}

// startNodeAgent runs `quartermaster node-agent` for pod, with its DaemonSet's args and env as
// the kubelet would give them, but the node's root at node.Root and the cache at endpoint (a
// loopback address where a node reaches the mirror's Service).
func startNodeAgent(t *testing.T, ds *appsv1.DaemonSet, pod *corev1.Pod, node *containerdNode, endpoint string) {
	t.Helper()
	startNodeAgentOf(t, managerBin, ds, pod, node, endpoint)
}

// startNodeAgentOf is startNodeAgent with another build of the binary (an earlier release's).
func startNodeAgentOf(t *testing.T, bin string, ds *appsv1.DaemonSet, pod *corev1.Pod, node *containerdNode, endpoint string) *process {
	t.Helper()
	container := ds.Spec.Template.Spec.Containers[0]
	var args []string
	for _, a := range container.Args {
		switch {
		case strings.HasPrefix(a, "--endpoint="):
			a = "--endpoint=" + endpoint
		case strings.HasPrefix(a, "--root="):
			a = "--root=" + node.Root
		case strings.HasPrefix(a, "--probe-address="):
			a = "--probe-address=127.0.0.1:0"
		}
		args = append(args, a)
	}
	env := fieldEnv(t, container.Env, pod)
	return startBinaryAs(t, bin, "node agent "+pod.Spec.NodeName, mirrorsNamespace, ds.Spec.Template.Spec.ServiceAccountName, env, args...)
}

// fieldEnv resolves a container's environment as the kubelet does for the fields a mirror's
// containers use: values, and the Pod's name, namespace and node.
func fieldEnv(t *testing.T, vars []corev1.EnvVar, pod *corev1.Pod) []string {
	t.Helper()
	var env []string
	for _, v := range vars {
		value := v.Value
		if v.ValueFrom != nil {
			if v.ValueFrom.FieldRef == nil {
				t.Fatalf("env %s: only fieldRef is resolved here", v.Name)
			}
			switch v.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				value = pod.Name
			case "metadata.namespace":
				value = pod.Namespace
			case "spec.nodeName":
				value = pod.Spec.NodeName
			default:
				t.Fatalf("env %s: field %s is not resolved here", v.Name, v.ValueFrom.FieldRef.FieldPath)
			}
		}
		env = append(env, v.Name+"="+value)
	}
	return env
}

// expandVars replaces the $(NAME) references to env's variables in args, as the kubelet expands a
// container's args.
func expandVars(args, env []string) []string {
	pairs := make([]string, 0, 2*len(env))
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		pairs = append(pairs, "$("+name+")", value)
	}
	r := strings.NewReplacer(pairs...)
	out := make([]string, 0, len(args))
	for _, a := range args {
		out = append(out, r.Replace(a))
	}
	return out
}

// waitNodeState waits until the agent's Pod reports configured (true/false) with reason.
func waitNodeState(t *testing.T, c client.Client, pod *corev1.Pod, configured, reason string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	eventually(t, fmt.Sprintf("the agent's Pod to report node-configured=%s (%s)", configured, reason), func() bool {
		return c.Get(context.Background(), client.ObjectKeyFromObject(pod), p) == nil &&
			p.Annotations[nodeagent.AnnotationConfigured] == configured && p.Annotations[nodeagent.AnnotationReason] == reason
	})
	return p
}

// cachePod runs the mirror's cache as its StatefulSet's pod would: the quartermaster binary with
// the container's args and env, the cache Secret's keys as files at the Secret volume's mount
// path and a directory at the volume claim's, in a mount namespace of its own. Only the listen
// addresses differ (registry-mirror's --address, --metrics-address and, with peers, its
// --peer-address, on loopback ports of their own): a pod has a network namespace of its own, this
// process shares the machine's with every other test's.
type cachePod struct {
	// owner is the test whose end stops the cache (a subtest restarting it does not).
	owner           *testing.T
	URL, metricsURL string
	addr, debug     string
	mounts          []mount
	claim           int // the mount of the volume claim
	args, env       []string
	bin             string // the quartermaster binary the pod's image holds
	proc            *process
}

func newCachePod(t *testing.T, c client.Client, sts *appsv1.StatefulSet, secret *corev1.Secret) *cachePod {
	t.Helper()
	spec := sts.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(sts.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("the cache StatefulSet has %d containers and %d claims, want one of each", len(spec.Containers), len(sts.Spec.VolumeClaimTemplates))
	}
	container := spec.Containers[0]
	// The StatefulSet's first pod, as the kubelet would run it: its env resolved, and the args'
	// $(VAR) references to it expanded.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sts.Namespace, Name: sts.Name + "-0"}}
	env := fieldEnv(t, container.Env, pod)
	cp := &cachePod{owner: t, addr: freeLoopbackAddr(t), debug: freeLoopbackAddr(t), args: expandVars(container.Args, env), env: env, bin: managerBin}
	cp.URL = "http://" + cp.addr
	cp.metricsURL = "http://" + cp.debug + mirror.MetricsPath
	cp.args = append(cp.args, "--address="+cp.addr, "--metrics-address="+cp.debug)
	if slices.ContainsFunc(cp.args, func(a string) bool {
		return strings.HasPrefix(a, "--peers-service=") || strings.HasPrefix(a, "--peers=")
	}) {
		cp.args = append(cp.args, "--peer-address="+freeLoopbackAddr(t))
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, vm := range container.VolumeMounts {
		dir := t.TempDir()
		switch v, ok := volumes[vm.Name]; {
		case vm.Name == sts.Spec.VolumeClaimTemplates[0].Name:
			cp.claim = len(cp.mounts)
		case ok && v.Secret != nil && v.Secret.SecretName == secret.Name:
			mode := os.FileMode(ptr.Deref(v.Secret.DefaultMode, 0o644))
			for key, value := range secret.Data {
				must(t, os.WriteFile(filepath.Join(dir, key), value, mode))
			}
		case ok && v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(p corev1.VolumeProjection) bool { return p.ServiceAccountToken != nil }):
			// As the kubelet mounts the pod's token: the ServiceAccount's, under its RBAC and
			// policies, given as a kubeconfig (the API server is not where in-cluster config looks).
			kubeconfig, _, err := cluster.ServiceAccountKubeconfig(context.Background(), sts.Namespace, spec.ServiceAccountName, time.Hour)
			must(t, err)
			path := filepath.Join(dir, "kubeconfig")
			must(t, os.WriteFile(path, kubeconfig, 0o600))
			cp.env = append(cp.env, "KUBECONFIG="+path)
			continue
		case ok && v.ConfigMap != nil:
			// As the kubelet mounts it when the pod starts (an optional one that does not exist
			// is an empty directory); the test's copy is not updated afterwards.
			cm := &corev1.ConfigMap{}
			err := c.Get(context.Background(), client.ObjectKey{Namespace: sts.Namespace, Name: v.ConfigMap.Name}, cm)
			if err != nil && (!apierrors.IsNotFound(err) || !ptr.Deref(v.ConfigMap.Optional, false)) {
				t.Fatalf("the cache's ConfigMap %s: %v", v.ConfigMap.Name, err)
			}
			mode := os.FileMode(ptr.Deref(v.ConfigMap.DefaultMode, 0o644))
			for key, value := range cm.Data {
				must(t, os.WriteFile(filepath.Join(dir, key), []byte(value), mode))
			}
		default:
			t.Fatalf("the cache mounts volume %s, which this test does not provide", vm.Name)
		}
		cp.mounts = append(cp.mounts, mount{source: dir, target: vm.MountPath})
	}
	return cp
}

// listenAsDistribution gives the listen addresses as a cache of releases before 2026-11-27 took
// them (distribution's REGISTRY_HTTP_ADDR and REGISTRY_HTTP_DEBUG_ADDR), not as flags.
func (cp *cachePod) listenAsDistribution() {
	cp.args = slices.DeleteFunc(cp.args, func(a string) bool {
		return strings.HasPrefix(a, "--address=") || strings.HasPrefix(a, "--metrics-address=") || strings.HasPrefix(a, "--peer-address=")
	})
	cp.env = append(cp.env, "REGISTRY_HTTP_ADDR="+cp.addr, "REGISTRY_HTTP_DEBUG_ADDR="+cp.debug)
}

// onVolume gives the pod dir as its claim's volume (one an earlier pod of the StatefulSet filled).
func (cp *cachePod) onVolume(dir string) { cp.mounts[cp.claim].source = dir }

// start runs the cache and waits until it is ready (its readiness path answers 200).
func (cp *cachePod) start(t *testing.T) {
	t.Helper()
	cp.proc = startInMounts(cp.owner, "cache", cp.mounts, cp.env, append([]string{cp.bin}, cp.args...)...)
	proc := cp.proc
	eventually(t, "the cache to be ready", func() bool {
		select {
		case err := <-proc.done:
			proc.stopped = true // it exited: nothing to stop
			t.Fatalf("the cache exited: %v\n%s", err, proc.logs)
		default:
		}
		resp, err := http.Get(cp.URL + mirror.ReadyPath)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func (cp *cachePod) stop(t *testing.T) { cp.proc.stop(t) }

// metrics scrapes the cache's metrics: "name{labels}" → value.
func (cp *cachePod) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get(cp.metricsURL)
	must(t, err)
	defer resp.Body.Close()
	out, err := promtext.Parse(resp.Body)
	must(t, err)
	return out
}

// freeLoopbackAddr is a loopback address with a port free now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().String()
}
