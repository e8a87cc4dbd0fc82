// Package policies checks the manager's admission policies of config/rbac on envtest's API server:
// make test-unit runs it on the Kubernetes the project runs on, make test-k8s-min on the oldest
// docs/install.md supports (ValidatingAdmissionPolicy v1 with namespaceObject and matchConditions).
// The e2e tests check them on the local cluster, with real ServiceAccount tokens.
package policies

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/policyprobe"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestManagerPoliciesAreEnforced applies config/local (CRDs, RBAC, admission policies) and, as the
// manager's ServiceAccount, is refused by each policy, and allowed what the namespaces controller
// does: a quota in a namespace it manages.
func TestManagerPoliciesAreEnforced(t *testing.T) {
	ctx := context.Background()
	env := startWithLocalConfig(t)
	asManager := managerClient(t, env)
	if err := policyprobe.WaitEnforced(ctx, asManager, "quartermaster", "quartermaster-mirrors"); err != nil {
		t.Fatal(err)
	}

	managed := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "managed", Labels: map[string]string{"quartermaster.dev/managed-by": "quartermaster"}}}
	if err := env.Client.Create(ctx, managed); err != nil {
		t.Fatal(err)
	}
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "defaults"}}
	if _, err := asManager.CoreV1().ResourceQuotas(managed.Name).Create(ctx, quota, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a quota in a namespace the manager manages: %v, want allowed", err)
	}

	// A cache pod: the manager may change its registry.quartermaster.dev/ annotations, not its image.
	cachePod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "quartermaster-mirrors", Name: "mirror-hub-0"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "cache", Image: "quartermaster:test"}}}}
	if err := env.Client.Create(ctx, cachePod); err != nil {
		t.Fatal(err)
	}
	patchPod := func(body string) error {
		_, err := asManager.CoreV1().Pods(cachePod.Namespace).Patch(ctx, cachePod.Name, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	const annotationsOnly = "Quartermaster's manager may change only a pod's registry.quartermaster.dev/ annotations."
	testenv.PollFor(t, fmt.Sprintf("changing a cache pod's image to be refused with %q", annotationsOnly), 100*time.Millisecond, time.Minute, func() (bool, string) {
		err := patchPod(`{"spec":{"containers":[{"name":"cache","image":"evil:latest"}]}}`)
		return err != nil && strings.Contains(err.Error(), annotationsOnly), fmt.Sprintf("last: %v", err)
	})
	if err := patchPod(`{"metadata":{"annotations":{"example.com/x":"y"}}}`); err == nil || !strings.Contains(err.Error(), annotationsOnly) {
		t.Errorf("another annotation of a cache pod: %v, want refused with %q", err, annotationsOnly)
	}
	if err := patchPod(`{"metadata":{"annotations":{"registry.quartermaster.dev/pins-requested":"0123@2026-11-27T00:00:00Z#1"}}}`); err != nil {
		t.Errorf("asking for a cache pod's pins: %v, want allowed", err)
	}

	// A cache's StatefulSet has an API token only as the caches' ServiceAccount.
	in := mirror.Install{Namespace: "quartermaster-mirrors", Image: "quartermaster:test", AgentServiceAccount: "quartermaster-node-agent", CacheServiceAccount: "quartermaster-mirror-cache"}
	spec := mirror.Spec{Name: "hub", UpstreamURL: "https://registry-1.docker.io", MirrorHost: "docker.io", Replicas: 1, StorageSize: resource.MustParse("1Gi")}
	createSTS := func(sts *appsv1.StatefulSet) error {
		_, err := asManager.AppsV1().StatefulSets(in.Namespace).Create(ctx, sts, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := createSTS(mirror.StatefulSet(in, spec, "hash")); err != nil {
		t.Errorf("a cache's StatefulSet as the caches' ServiceAccount: %v, want allowed", err)
	}
	in.CacheServiceAccount = ""
	if err := createSTS(mirror.StatefulSet(in, spec, "hash")); err != nil {
		t.Errorf("a cache's StatefulSet without an API token: %v, want allowed", err)
	}
	const tokenOnly = "Quartermaster's manager runs StatefulSets without an automounted API token, and mounts a token only of the caches' ServiceAccount."
	automounted := mirror.StatefulSet(in, spec, "hash")
	automounted.Spec.Template.Spec.AutomountServiceAccountToken = ptr.To(true)
	in.CacheServiceAccount = "quartermaster-mirror-cache"
	cacheSA := mirror.StatefulSet(in, spec, "hash")
	cacheSA.Spec.Template.Spec.AutomountServiceAccountToken = ptr.To(true)
	otherSA := mirror.StatefulSet(in, spec, "hash")
	otherSA.Spec.Template.Spec.ServiceAccountName = "default"
	for what, sts := range map[string]*appsv1.StatefulSet{
		"the default ServiceAccount's token automounted":       automounted,
		"the caches' ServiceAccount's token automounted":       cacheSA,
		"another ServiceAccount's token in a projected volume": otherSA,
	} {
		if err := createSTS(sts); err == nil || !strings.Contains(err.Error(), tokenOnly) {
			t.Errorf("a cache's StatefulSet with %s: %v, want refused with %q", what, err, tokenOnly)
		}
	}
}

// TestNodeAgentPolicyIsEnforced applies config/local and, as a node agent or a cache holding a
// token bound to its Pod (impersonated: envtest's users authenticate by certificate, which carries
// no extra), may annotate its own Pod's registry.quartermaster.dev/ keys and nothing else: the
// policy's own messages, on the oldest Kubernetes supported too (make test-k8s-min). The e2e tests
// check it with a real Pod-bound token.
func TestNodeAgentPolicyIsEnforced(t *testing.T) {
	ctx := context.Background()
	env := startWithLocalConfig(t)
	const ns = "quartermaster-mirrors"
	for _, name := range []string{"pod-a", "pod-b"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "node-agent"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "agent"}}}}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	for _, sa := range []string{"quartermaster-node-agent", "quartermaster-mirror-cache"} {
		t.Run(sa, func(t *testing.T) {
			cfg := rest.CopyConfig(env.Config)
			cfg.Impersonate = rest.ImpersonationConfig{
				UserName: "system:serviceaccount:quartermaster-mirrors:" + sa,
				Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:quartermaster-mirrors", "system:authenticated"},
				Extra:    map[string][]string{"authentication.kubernetes.io/pod-name": {"pod-a"}},
			}
			as, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			patch := func(pod, body string) error {
				_, err := as.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
				return err
			}
			const (
				mine      = `{"metadata":{"annotations":{"registry.quartermaster.dev/mirrors":"ready"}}}`
				ownOnly   = "A node agent or a cache may annotate only its own Pod."
				annotOnly = "A node agent or a cache may change only its Pod's registry.quartermaster.dev/ annotations."
			)
			// The API server loads a policy from a watch a moment after it is created.
			testenv.PollFor(t, fmt.Sprintf("annotating another Pod to be refused with %q", ownOnly), 100*time.Millisecond, time.Minute, func() (bool, string) {
				err := patch("pod-b", mine)
				return err != nil && strings.Contains(err.Error(), ownOnly), fmt.Sprintf("last: %v", err)
			})
			if err := patch("pod-a", mine); err != nil {
				t.Errorf("annotating its own Pod's registry.quartermaster.dev/ key: %v, want allowed", err)
			}
			for what, body := range map[string]string{
				"another annotation": `{"metadata":{"annotations":{"example.com/x":"y"}}}`,
				"a label":            `{"metadata":{"labels":{"app":"other"}}}`,
				"the spec":           `{"spec":{"activeDeadlineSeconds":5}}`,
			} {
				if err := patch("pod-a", body); err == nil || !strings.Contains(err.Error(), annotOnly) {
					t.Errorf("changing %s of its own Pod: %v, want refused with %q", what, err, annotOnly)
				}
			}
		})
	}
}

// TestExchangeRequestsPolicyIsEnforced applies config/local and checks that only the manager may
// write the keys by which the keyless exchange records which identity a request belongs to: an
// administrator (and so any pipeline of the ConfigMap path) is refused with the policy's own
// message when it sets or changes them, and may write everything else of such a request.
func TestExchangeRequestsPolicyIsEnforced(t *testing.T) {
	ctx := context.Background()
	env := startWithLocalConfig(t)
	asManager := managerClient(t, env)
	asAdmin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const (
		ns      = "namespace-requests" // where the manager may create request ConfigMaps
		refusal = "Only Quartermaster's token exchange may set, change or remove"
	)
	if _, err := asAdmin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	forged := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ci-web-main",
		Labels:      map[string]string{"quartermaster.dev/identity": "0123456789abcdef"},
		Annotations: map[string]string{"quartermaster.dev/identity": "github:acme/web"}}}
	// The API server loads a policy from a watch a moment after it is created.
	testenv.PollFor(t, fmt.Sprintf("a request claiming an identity, made by an administrator, to be refused with %q", refusal), 100*time.Millisecond, time.Minute, func() (bool, string) {
		_, err := asAdmin.CoreV1().ConfigMaps(ns).Create(ctx, forged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), refusal), fmt.Sprintf("last: %v", err)
	})
	plain := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ci-plain"}, Data: map[string]string{"ttl": "1h"}}
	if _, err := asAdmin.CoreV1().ConfigMaps(ns).Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Errorf("a request of the ConfigMap path: %v, want allowed", err)
	}
	// A request of the ConfigMap path choosing a profile (a bigger quota) a TrustedIssuer rule gives.
	profiled := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ci-profiled", Annotations: map[string]string{"quartermaster.dev/defaults": "large"}}}
	if _, err := asAdmin.CoreV1().ConfigMaps(ns).Create(ctx, profiled, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil || !strings.Contains(err.Error(), refusal) {
		t.Errorf("a request of the ConfigMap path naming a defaults profile: %v, want refused with %q", err, refusal)
	}
	if _, err := asManager.CoreV1().ConfigMaps(ns).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the exchange's request, made by the manager: %v, want allowed", err)
	}
	patch := func(body string) error {
		_, err := asAdmin.CoreV1().ConfigMaps(ns).Patch(ctx, forged.Name, types.MergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	for what, body := range map[string]string{
		"another identity":          `{"metadata":{"annotations":{"quartermaster.dev/identity":"github:evil/web"}}}`,
		"the identity removed":      `{"metadata":{"annotations":{"quartermaster.dev/identity":null}}}`,
		"another identity's digest": `{"metadata":{"labels":{"quartermaster.dev/identity":"fedcba9876543210"}}}`,
		"an earlier requested-at":   `{"metadata":{"annotations":{"quartermaster.dev/requested-at":"2000-01-01T00:00:00.000000000Z"}}}`,
		"a defaults profile":        `{"metadata":{"annotations":{"quartermaster.dev/defaults":"large"}}}`,
	} {
		if err := patch(body); err == nil || !strings.Contains(err.Error(), refusal) {
			t.Errorf("an administrator writing %s: %v, want refused with %q", what, err, refusal)
		}
	}
	if err := patch(`{"data":{"ttl":"2h"},"metadata":{"annotations":{"example.com/note":"x"}}}`); err != nil {
		t.Errorf("an administrator writing the data and other annotations of the request: %v, want allowed", err)
	}
}

// managerClient is a client authenticated as the manager's ServiceAccount: envtest authenticates by
// client certificate, with the user name and groups its RoleBindings and the policies'
// matchConditions name.
func managerClient(t *testing.T, env *testenv.Env) kubernetes.Interface {
	t.Helper()
	user, err := env.AddUser(envtest.User{
		Name:   "system:serviceaccount:quartermaster-system:quartermaster-manager",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:quartermaster-system"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(user.Config())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startWithLocalConfig starts envtest's API server and applies config/local to it (CRDs, RBAC,
// admission policies), as admin.
func startWithLocalConfig(t *testing.T) *testenv.Env {
	t.Helper()
	env := testenv.Start(t)
	apply := exec.Command(filepath.Join(testenv.Assets(t), "kubectl"), "apply", "--server-side", "-k", "config/local",
		"--kubeconfig", env.KubeconfigFor(t, "admin", "system:masters"))
	apply.Dir = testenv.RepoRoot()
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -k config/local: %v\n%s", err, out)
	}
	return env
}
