//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	registryv1alpha1 "github.com/quartermaster-dev/quartermaster/api/registry/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/nodeagent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// cacheBlobHits is the cache's count of blobs it served from its volume.
const cacheBlobHits = `quartermaster_mirror_cache_requests_total{result="hit",type="blob"}`

// TestCacheVolumeOfTheEarlierReleaseServesAfterUpgrade: what a mirror's cache stored under the
// earlier release (hack/earlier-release) is served by this commit's. The earlier release's
// manager renders a RegistryMirror's objects; its cache (that release's binary, as the rendered
// StatefulSet runs it) fills its volume while a real containerd pulls an image through it, the
// earlier release's node agent pointing containerd at it. Then this commit's manager renders the
// objects again, and its cache, on the same volume, with the upstream down, serves the image to
// containerd (the node's copy removed) from the volume alone, and the tag list too.
func TestCacheVolumeOfTheEarlierReleaseServesAfterUpgrade(t *testing.T) {
	parallel(t, mirrorsController)
	ctx := context.Background()
	prev := previousRelease(t)
	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(registryv1alpha1.AddToScheme)})
	must(t, err)
	const user, password = "puller", "e2e-volume-upgrade-secret"
	up := startPrivateRegistry(t, user, password)
	image := up.PushImage(t, "team/app", "v1")
	rm := processMirror(t, c, "e2e-volume-upgrade", up, user, password, nil)
	node := startContainerd(t, registrySingleDir)
	volume := t.TempDir() // the cache pod's claim, kept across the upgrade

	// A release serves the mirror: its manager renders the objects (then stops: the next
	// release's takes over), its cache runs on the volume, its agent points the node at it.
	type served struct {
		cache *cachePod
		agent *process
	}
	release := func(name, bin, tag string) served {
		t.Helper()
		image := "quartermaster:" + tag
		mgr := startBinaryAs(t, bin, "manager ("+name+")", managerNamespace, "quartermaster-manager", nil,
			"--controllers=mirrors", "--health-probe-bind-address=0", "--mirrors-image="+image)
		secret, sts, ds := &corev1.Secret{}, &appsv1.StatefulSet{}, &appsv1.DaemonSet{}
		agent := &corev1.Pod{}
		eventually(t, "the "+name+" release's rendering of the mirror: its cache Secret, StatefulSet and an agent Pod", func() bool {
			if c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.SecretName(rm.Name)}, secret) != nil ||
				c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.CacheName(rm.Name)}, sts) != nil ||
				c.Get(ctx, client.ObjectKey{Namespace: mirrorsNamespace, Name: mirror.AgentName(rm.Name)}, ds) != nil ||
				sts.Spec.Template.Spec.Containers[0].Image != image || ds.Spec.Template.Spec.Containers[0].Image != image ||
				sts.Spec.Template.Annotations[mirror.AnnotationConfigHash] != mirror.ConfigHash(secret.Data) {
				return false
			}
			pods := &corev1.PodList{}
			if c.List(ctx, pods, client.InNamespace(mirrorsNamespace), client.MatchingLabels{
				mirror.LabelMirror: rm.Name, mirror.LabelComponent: mirror.ComponentAgent}) != nil {
				return false
			}
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && p.Spec.Containers[0].Image == image {
					*agent = p
					return true
				}
			}
			return false
		})
		mgr.stop(t)
		cache := newCachePod(t, c, sts, secret)
		cache.bin = bin
		cache.onVolume(volume)
		if help, _ := exec.Command(bin, "registry-mirror", "--help").CombinedOutput(); !strings.Contains(string(help), "--address") {
			cache.listenAsDistribution() // a release whose cache was distribution's
		}
		cache.start(t)
		s := served{cache: cache, agent: startNodeAgentOf(t, bin, ds, agent, node, cache.URL)}
		waitNodeState(t, c, agent, "true", nodeagent.ReasonConfigured)
		return s
	}

	earlier := release("earlier", prev.bin, "old-"+prev.commit[:12])
	up.Requests()
	mustPullImage(t, node, image, nil)
	if seen := up.Requests(); upstreamregistry.BlobGETs(seen, "") != 2 || upstreamregistry.BlobGETs(seen, "containerd/") != 0 {
		t.Fatalf("through the earlier release's cache the upstream served %d blob GETs (%d to containerd), want 2, all to the cache: %v",
			upstreamregistry.BlobGETs(seen, ""), upstreamregistry.BlobGETs(seen, "containerd/"), seen)
	}
	earlier.agent.stop(t)
	earlier.cache.stop(t)

	// The upgrade, the upstream down: this commit's cache has only the earlier one's volume.
	up.Stop()
	node.remove(t, image)
	now := release("this commit's", managerBin, "e2e")
	before := now.cache.metrics(t)
	mustPullImage(t, node, image, nil)
	after := now.cache.metrics(t)
	if hits := after[cacheBlobHits] - before[cacheBlobHits]; hits != 2 {
		t.Errorf("this commit's cache served %v blobs from the earlier release's volume, want 2 (the config and the layer)", hits)
	}
	if served := after[servedGETs] - before[servedGETs]; served < 3 {
		t.Errorf("this commit's cache served %v GETs, want the manifest and both blobs", served)
	}
	resp, err := http.Get(now.cache.URL + "/v2/team/app/tags/list")
	must(t, err)
	defer resp.Body.Close()
	var tags struct{ Tags []string }
	if err := json.NewDecoder(resp.Body).Decode(&tags); err != nil || resp.StatusCode != http.StatusOK || !slices.Equal(tags.Tags, []string{"v1"}) {
		t.Errorf("team/app's tags from the earlier release's volume, the upstream down: %d %v (%v), want [v1]", resp.StatusCode, tags.Tags, err)
	}
	if strings.Contains(now.cache.proc.logs.String(), password) {
		t.Error("the cache logged the upstream's password")
	}
}
