//go:build e2e

package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/chart"
	"github.com/quartermaster-dev/quartermaster/internal/testing/realcluster"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The upgraded release: names of its own beside the suite's release (the namespaces controller
// alone, so it serves only the requests of its own namespace; the CRDs are the suite's release's).
const (
	upRelease   = "qm-up"
	upNamespace = "qm-up-system"
	upRequests  = "qm-up-requests"
)

// TestHelmUpgradeAndRollbackOnTheRealNode installs the chart of the earlier release
// (hack/earlier-release, the newest commit that landed), with that commit's image (built as its make image built it, loaded
// into the node), then, while a load generator keeps creating namespace requests, upgrades the
// release to this commit's chart and image, then rolls it back, each with helm --wait. The
// manager's Pods really roll on the kubelet: at every moment some manager Pod is Ready, their
// PodDisruptionBudget refuses the eviction that would leave none, and no request is lost: every
// one made during the upgrade is served, its Namespace and Secret each created once, and stays so
// through the rollback.
func TestHelmUpgradeAndRollbackOnTheRealNode(t *testing.T) {
	ctx := context.Background()
	prev := previousRelease(t)
	values := func(tag string) string {
		v := map[string]any{
			"fullnameOverride": upRelease,
			"image":            map[string]any{"repository": "quartermaster", "tag": tag, "pullPolicy": "Never"},
			"crds":             map[string]any{"enabled": false},
			"leaderElection":   map[string]any{"id": "qm-up"},
			"namespaces":       map[string]any{"requestsNamespace": upRequests},
			"mirrors":          map[string]any{"enabled": false},
			"intents":          map[string]any{"enabled": false},
		}
		data, err := yaml.Marshal(v)
		must(t, err)
		f := filepath.Join(t.TempDir(), "values-"+tag+".yaml")
		must(t, os.WriteFile(f, data, 0o600))
		return f
	}
	helm := func(args ...string) {
		t.Helper()
		if out, err := testenv.Helm4.Run(append(args, "--namespace", upNamespace, "--kubeconfig", cluster.Kubeconfig,
			"--wait", "--timeout", "3m")...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	helm("install", upRelease, filepath.Join(prev.dir, chart.Dir), "--create-namespace", "-f", values(prev.tag))
	t.Cleanup(func() {
		_, _ = testenv.Helm4.Run("uninstall", upRelease, "--namespace", upNamespace, "--kubeconfig", cluster.Kubeconfig, "--wait")
		for _, ns := range []string{upNamespace, upRequests} {
			_ = admin.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		}
	})
	upLabels := client.MatchingLabels{"app.kubernetes.io/instance": upRelease, "app.kubernetes.io/component": "manager"}

	// What serving a request writes, from now on.
	created := map[string]int{}
	var mu sync.Mutex
	for _, w := range []func() (watch.Interface, error){
		func() (watch.Interface, error) {
			return kube.CoreV1().Secrets(upRequests).Watch(ctx, metav1.ListOptions{})
		},
		func() (watch.Interface, error) { return kube.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{}) },
	} {
		wi, err := w()
		must(t, err)
		t.Cleanup(wi.Stop)
		go func() {
			for e := range wi.ResultChan() {
				obj, ok := e.Object.(client.Object)
				if !ok || e.Type != watch.Added || !strings.HasPrefix(obj.GetName(), "qm-up-req-") {
					continue
				}
				mu.Lock()
				created[fmt.Sprintf("%T/%s", obj, obj.GetName())]++
				mu.Unlock()
			}
		}()
	}

	// The load: a request every 200 ms while the release changes; and a watch on the manager's
	// Pods: none Ready is an outage.
	var requests []string
	stopLoad, stop := make(chan struct{}), make(chan struct{})
	var load, wg sync.WaitGroup
	load.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopLoad:
				return
			case <-time.After(200 * time.Millisecond):
			}
			name := fmt.Sprintf("qm-up-req-%03d", i)
			if err := admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: upRequests, Name: name}}); err != nil {
				t.Errorf("creating request %s: %v", name, err)
				return
			}
			requests = append(requests, name)
		}
	})
	var outage []string
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			pods := &corev1.PodList{}
			if admin.List(ctx, pods, client.InNamespace(upNamespace), upLabels) != nil {
				continue
			}
			ready := 0
			for _, p := range pods.Items {
				if podReady(&p) && p.DeletionTimestamp == nil {
					ready++
				}
			}
			if ready == 0 {
				outage = append(outage, time.Now().Format("15:04:05.000"))
			}
		}
	})

	start := time.Now()
	helm("upgrade", upRelease, chart.Dir, "-f", values(imageTag))
	t.Logf("upgraded from %s to this commit in %s", prev.commit[:12], time.Since(start).Round(100*time.Millisecond))
	for _, p := range managerPodsOf(t, upLabels) {
		if p.Spec.Containers[0].Image != realcluster.ProjectImage+":"+imageTag && !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+imageTag) {
			t.Errorf("after the upgrade pod %s runs %s", p.Name, p.Spec.Containers[0].Image)
		}
	}

	// The PodDisruptionBudget (minAvailable 1): one manager Pod may be evicted, the other not until
	// its replacement is Ready.
	pods := managerPodsOf(t, upLabels)
	if len(pods) != 2 {
		t.Fatalf("%d manager pods after the upgrade, want 2", len(pods))
	}
	evict := func(p corev1.Pod) error {
		return kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
	}
	must(t, evict(pods[0]))
	if err := evict(pods[1]); !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
		t.Errorf("evicting the second manager pod at once: %v, want the disruption budget's refusal", err)
	}

	// The rollback: the earlier release cannot serve a request on a cluster that enforces
	// OwnerReferencesPermissionEnforcement (its Role lacks delete on the requests, which this release
	// adds), so no request is made from here on; the Pods roll back with no outage, and nothing
	// served is lost.
	close(stopLoad)
	load.Wait()
	served := func() time.Duration {
		longest := time.Duration(0)
		for _, name := range requests {
			cm := &corev1.ConfigMap{}
			began := time.Now()
			eventually(t, "request "+name+" to be Ready", func() bool {
				return admin.Get(ctx, client.ObjectKey{Namespace: upRequests, Name: name}, cm) == nil &&
					cm.Annotations[nsrequest.AnnotationStatus] == "Ready"
			})
			longest = max(longest, time.Since(began))
		}
		return longest
	}
	longest := served()
	start = time.Now()
	helm("rollback", upRelease)
	t.Logf("rolled back in %s", time.Since(start).Round(100*time.Millisecond))
	close(stop)
	wg.Wait()
	if len(outage) > 0 {
		t.Errorf("no manager pod was Ready at %d moments: %v", len(outage), outage)
	}

	// Every request still served after the rollback, each Namespace and Secret created once.
	served()
	mu.Lock()
	defer mu.Unlock()
	for _, name := range requests {
		for _, key := range []string{"*v1.Secret/" + name, "*v1.Namespace/" + name} {
			if created[key] != 1 {
				t.Errorf("%s created %d times, want once", key, created[key])
			}
		}
	}
	t.Logf("%d requests made during the upgrade, every one served once (the last waited %s more once the load stopped)",
		len(requests), longest.Round(100*time.Millisecond))
}

// managerPodsOf are the running (not deleted) manager pods of a release.
func managerPodsOf(t *testing.T, labels client.MatchingLabels) []corev1.Pod {
	t.Helper()
	list := &corev1.PodList{}
	must(t, admin.List(context.Background(), list, client.InNamespace(upNamespace), labels))
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// earlierRelease is testenv.EarlierRelease with its image built as its make image did and loaded
// into the node as quartermaster:TAG.
type earlierRelease struct{ commit, dir, tag string }

func previousRelease(t *testing.T) earlierRelease {
	t.Helper()
	r := earlierRelease{}
	r.commit, r.dir = testenv.EarlierRelease(t)
	r.tag = "old-" + r.commit[:12]
	// Built once per commit and platform (testenv.EarlierReleaseBuild keeps it in the cache).
	_, out := testenv.EarlierReleaseBuild(t, "image-"+r.tag+"-"+runtime.GOARCH, func(src, out string) error {
		build := exec.Command("go", "run", "./hack/image", "build", "--out", out, "--tag", r.tag, "--platforms", "linux/"+runtime.GOARCH)
		build.Dir = src
		build.Env = append(os.Environ(), "GOWORK=off", "SOURCE_DATE_EPOCH=0")
		if b, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("%w\n%s", err, b)
		}
		return nil
	})
	must(t, cluster.Load(realcluster.ProjectImage, filepath.Join(out, "quartermaster.oci.tar")))
	return r
}
