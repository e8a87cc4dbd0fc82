//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// mirrorsNamespace is the mirrors' namespace config/namespace makes (--mirrors-namespace).
const mirrorsNamespace = "quartermaster-mirrors"

// TestRegistryMirrorOnTheLocalCluster runs the manager (as its ServiceAccount) with the mirrors
// controller: a RegistryMirror goes Ready as kwok runs its cache pod (on a volume the test
// provides: no provisioner runs) and its node agents; the node agent, run as a process against a
// temporary root under its own ServiceAccount, writes the node's hosts.toml and reports on its
// Pod; deleting the mirror removes every object through garbage collection, the volume per its
// deletionPolicy, and the agent's file when it stops.
func TestRegistryMirrorOnTheLocalCluster(t *testing.T) {
	parallel(t, mirrorsController)
	ctx := context.Background()
	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(registryv1alpha1.AddToScheme)})
	must(t, err)
	// The upstream the controller asks about credentials: an open registry root on loopback.
	upstreamURL := newOpenRegistry(t)
	mgr := startManager(t, "--controllers=mirrors", "--health-probe-bind-address=0", "--mirrors-image=quartermaster:e2e")

	// Volumes for the cache pods' claims (storageClassName "" binds to them), each reserved for
	// its claim: a claim another test left unbound must not take one.
	for i, name := range []string{"e2e-hub", "e2e-kept"} {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("mirror-e2e-%d", i)},
			Spec: corev1.PersistentVolumeSpec{
				ClaimRef:                      &corev1.ObjectReference{Namespace: mirrorsNamespace, Name: mirror.PVCName(name, 0)},
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              "",
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/tmp/mirror-e2e-%d", i)}},
			},
		}
		must(t, c.Create(ctx, pv))
		t.Cleanup(func() { _ = c.Delete(ctx, pv) })
	}
	newMirror := func(name, host string, policy registryv1alpha1.DeletionPolicy) *registryv1alpha1.RegistryMirror {
		rm := &registryv1alpha1.RegistryMirror{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: registryv1alpha1.RegistryMirrorSpec{
				UpstreamURL: upstreamURL, MirrorHost: host, Replicas: ptr.To[int32](1), DeletionPolicy: policy,
				Storage: &registryv1alpha1.Storage{Size: ptr.To(resource.MustParse("1Gi")), StorageClassName: ptr.To("")},
			},
		}
		must(t, c.Create(ctx, rm))
		return rm
	}
	hub := newMirror("e2e-hub", "docker.io", registryv1alpha1.DeletionPolicyDelete)
	kept := newMirror("e2e-kept", "quay.io", registryv1alpha1.DeletionPolicyRetain)

	for _, name := range []string{hub.Name, kept.Name} {
		if out, err := cluster.Kubectl(ctx, "wait", "rm/"+name, "--for=condition=Ready", "--timeout=180s"); err != nil {
			objects, _ := cluster.Kubectl(ctx, "get", "-n", mirrorsNamespace, "rm,sts,ds,pods,pvc", "-o", "wide")
			t.Fatalf("%s: %v\n%s\nmanager logs:\n%s", out, err, objects, mgr.logs.String())
		}
	}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(hub), hub))
	if hub.Status.ReadyReplicas != 1 || hub.Status.NodesConfigured != 2 || hub.Status.NodesDesired != 2 || hub.Status.Endpoint == "" {
		t.Errorf("status %+v", hub.Status)
	}
	t.Run("kubectl shows upstream, host, readiness and nodes", func(t *testing.T) {
		out := kubectlOK(t, "get", "rm", hub.Name, "--no-headers")
		got := strings.Fields(out)
		want := []string{hub.Name, upstreamURL, "docker.io", "True", "2"}
		if len(got) != len(want)+1 || strings.Join(got[:len(want)], " ") != strings.Join(want, " ") {
			t.Errorf("kubectl get rm: %q, want NAME UPSTREAM HOST READY NODES AGE = %v AGE", out, want)
		}
	})

	t.Run("the node agent writes hosts.toml and reports on its Pod", func(t *testing.T) {
		pods := &corev1.PodList{}
		must(t, c.List(ctx, pods, client.InNamespace(mirrorsNamespace), client.MatchingLabels{
			mirror.LabelMirror: hub.Name, mirror.LabelComponent: mirror.ComponentAgent}))
		if len(pods.Items) != 2 {
			t.Fatalf("%d agent pods, want one per node", len(pods.Items))
		}
		root := t.TempDir()
		must(t, os.MkdirAll(filepath.Join(root, "etc", "containerd"), 0o755))
		// containerd 2 configured as docs/mirrors.md says: config_path one directory.
		must(t, os.WriteFile(filepath.Join(root, "etc", "containerd", "config.toml"),
			[]byte("version = 3\n[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n"), 0o644))
		agent := startAgent(t, root, pods.Items[0].Name, hub)
		hosts := filepath.Join(root, "etc", "containerd", "certs.d", "docker.io", "hosts.toml")
		eventually(t, "hosts.toml with the mirror's endpoint", func() bool {
			b, err := os.ReadFile(hosts)
			return err == nil && strings.Contains(string(b), hub.Status.Endpoint) && strings.Contains(string(b), upstreamURL)
		})
		eventually(t, "the agent's Pod to say the node is configured", func() bool {
			p := &corev1.Pod{}
			return c.Get(ctx, client.ObjectKeyFromObject(&pods.Items[0]), p) == nil &&
				p.Annotations["registry.quartermaster.dev/node-configured"] == "true"
		})

		// The agents' token changes no pod but its annotations (admission policy): not a cache
		// pod's image, not an agent Pod's labels.
		agentConfig, _, err := cluster.ServiceAccountKubeconfig(ctx, mirrorsNamespace, "quartermaster-node-agent", 10*time.Minute)
		must(t, err)
		restConfig, err := clientcmd.RESTConfigFromKubeConfig(agentConfig)
		must(t, err)
		asAgent, err := client.New(restConfig, client.Options{Scheme: manager.Scheme()})
		must(t, err)
		for what, change := range map[string]func(p *corev1.Pod){
			"a cache pod's image":  func(p *corev1.Pod) { p.Spec.Containers[0].Image = "attacker.example/registry:evil" },
			"an agent Pod's label": func(p *corev1.Pod) { p.Labels["registry.quartermaster.dev/mirror"] = "other" },
			"another annotation":   func(p *corev1.Pod) { p.Annotations = map[string]string{"example.com/x": "y"} },
		} {
			name := pods.Items[0].Name
			if what == "a cache pod's image" {
				name = mirror.CacheName(hub.Name) + "-0"
			}
			p := &corev1.Pod{}
			must(t, c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: name}, p))
			patch := client.MergeFrom(p.DeepCopy())
			change(p)
			if err := asAgent.Patch(ctx, p, patch, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "A node agent or a cache may") {
				t.Errorf("the agents' token changing %s: want a denial by the admission policy, got %v", what, err)
			}
		}

		// Deleting the mirror: the garbage collector removes its objects and, per its
		// deletionPolicy, its volume; the agent, told to stop, removes its file.
		must(t, c.Delete(ctx, hub))
		must(t, c.Delete(ctx, kept))
		gone := func(obj client.Object) bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(obj), obj))
		}
		ns := mirrorsNamespace
		eventually(t, "the mirrors' objects to be collected", func() bool {
			for _, name := range []string{hub.Name, kept.Name} {
				for _, obj := range []client.Object{
					&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.CacheName(name)}},
					&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.AgentName(name)}},
					&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.CacheName(name)}},
					&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.HeadlessName(name)}},
					&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.SecretName(name)}},
				} {
					if !gone(obj) {
						return false
					}
				}
			}
			return true
		})
		eventually(t, "the Delete mirror's volume claim to be deleted", func() bool {
			return gone(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.PVCName(hub.Name, 0)}})
		})
		if gone(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mirror.PVCName(kept.Name, 0)}}) {
			t.Errorf("the Retain mirror's volume claim was deleted")
		}
		agent.stop(t)
		if _, err := os.Stat(hosts); !os.IsNotExist(err) {
			t.Errorf("hosts.toml after the mirror's deletion: %v", err)
		}
	})
}

// startAgent runs `quartermaster node-agent` for rm against a temporary root, as the given agent
// Pod, authenticated as the agents' ServiceAccount.
func startAgent(t *testing.T, root, pod string, rm *registryv1alpha1.RegistryMirror) *process {
	t.Helper()
	return startAs(t, "node agent", mirrorsNamespace, "quartermaster-node-agent",
		[]string{"POD_NAME=" + pod, "POD_NAMESPACE=" + mirrorsNamespace},
		"node-agent", "--mirror="+rm.Name, "--mirror-host="+rm.Status.MirrorHost, "--endpoint="+rm.Status.Endpoint,
		"--upstream="+rm.Spec.UpstreamURL, "--root="+root, "--probe-address=127.0.0.1:0", "--resync=1s")
}

// TestManagerRunsOnlyItsOwnPodsInTheMirrorsNamespace checks the admission policy that narrows what
// the manager's ServiceAccount may run in the privileged mirrors' namespace: the node agent
// DaemonSet the controller makes is accepted, the same DaemonSet made into a way onto the node is
// not.
func TestManagerRunsOnlyItsOwnPodsInTheMirrorsNamespace(t *testing.T) {
	parallel(t) // dry runs as the manager: no manager runs
	ctx := context.Background()
	cfg, err := restConfigAs(ctx, managerNamespace, "quartermaster-manager")
	must(t, err)
	asManager, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	must(t, err)
	in := mirror.Install{Namespace: mirrorsNamespace, Image: "quartermaster:e2e", AgentServiceAccount: "quartermaster-node-agent"}
	s, err := mirror.Resolve(&registryv1alpha1.RegistryMirror{ObjectMeta: metav1.ObjectMeta{Name: "e2e-policy"},
		Spec: registryv1alpha1.RegistryMirrorSpec{UpstreamURL: "https://quay.io"}})
	must(t, err)
	agent := func() *appsv1.DaemonSet { return mirror.AgentDaemonSet(in, s, "http://10.0.0.1:5000") }

	// What the controller makes passes (dry run: nothing is left behind).
	must(t, asManager.Create(ctx, agent(), client.DryRunAll))
	for name, tc := range map[string]struct {
		mutate func(*corev1.PodSpec)
		want   string
	}{
		"the node's root mounted": {func(p *corev1.PodSpec) {
			p.Volumes[0].HostPath.Path = "/"
		}, "no host path but /etc/containerd"},
		"a shell instead of the agent": {func(p *corev1.PodSpec) {
			p.Containers[0].Command = []string{"/bin/sh", "-c", "cat /host/etc/shadow"}
		}, "only its own registry-mirror and node-agent subcommands"},
		"a privileged container": {func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext.Privileged = ptr.To(true)
			p.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil // the API server refuses privileged without escalation
		}, "without privilege"},
		"the host's network": {func(p *corev1.PodSpec) {
			p.HostNetwork = true
		}, "host's network namespace"},
		"another ServiceAccount": {func(p *corev1.PodSpec) {
			p.ServiceAccountName = "default"
		}, "node agents' ServiceAccount"},
	} {
		ds := agent()
		tc.mutate(&ds.Spec.Template.Spec)
		err := asManager.Create(ctx, ds, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want a denial saying %q, got %v", name, tc.want, err)
		}
	}

	// The cache's StatefulSet with its storage init container (root, CAP_CHOWN alone) passes; the
	// init container made into anything more does not, nor an init container in a DaemonSet.
	in.PrepareStorage = true
	cache := func() *appsv1.StatefulSet { return mirror.StatefulSet(in, s, "hash") }
	must(t, asManager.Create(ctx, cache(), client.DryRunAll))
	const initWant = "no init or ephemeral containers but the caches' cache-storage"
	for name, mutate := range map[string]func(*corev1.PodSpec){
		"another capability": func(p *corev1.PodSpec) {
			p.InitContainers[0].SecurityContext.Capabilities.Add = append(p.InitContainers[0].SecurityContext.Capabilities.Add, "SYS_ADMIN")
		},
		"a shell": func(p *corev1.PodSpec) { p.InitContainers[0].Command = []string{"/bin/sh"} },
		"another subcommand": func(p *corev1.PodSpec) {
			p.InitContainers[0].Args = []string{"registry-mirror"}
		},
		"privilege escalation": func(p *corev1.PodSpec) {
			p.InitContainers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		},
	} {
		sts := cache()
		mutate(&sts.Spec.Template.Spec)
		if err := asManager.Create(ctx, sts, client.DryRunAll); err == nil || !strings.Contains(err.Error(), initWant) {
			t.Errorf("storage init container with %s: want a denial saying %q, got %v", name, initWant, err)
		}
	}
	ds := agent()
	ds.Spec.Template.Spec.InitContainers = cache().Spec.Template.Spec.InitContainers
	// Its volume, so that the API server's validation lets the object reach the policy.
	ds.Spec.Template.Spec.Volumes = append(ds.Spec.Template.Spec.Volumes,
		corev1.Volume{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	if err := asManager.Create(ctx, ds, client.DryRunAll); err == nil || !strings.Contains(err.Error(), initWant) {
		t.Errorf("the storage init container in the agents' DaemonSet: want a denial saying %q, got %v", initWant, err)
	}
}
