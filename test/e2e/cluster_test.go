//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// These tests prove the local cluster has what envtest lacks and what the controllers rely on.

func TestClusterGarbageCollectsDependents(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	ns := newNamespace(t)
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"}}
	must(t, admin.Create(ctx, owner))
	dependent := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: "dependent",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}},
	}}
	must(t, admin.Create(ctx, dependent))
	must(t, admin.Delete(ctx, owner))
	eventually(t, "the dependent Secret to be garbage collected", func() bool {
		return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKeyFromObject(dependent), &corev1.Secret{}))
	})
}

func TestClusterDeletesNamespacesWithTheirContents(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "qm-e2e-nsdel-"}}
	must(t, admin.Create(ctx, ns))
	must(t, admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "content"}}))
	must(t, admin.Delete(ctx, ns))
	awaitDeletion(t, "the namespace to be gone", func() (bool, string) { return namespaceGone(ctx, ns.Name) })
}

func TestClusterIssuesServiceAccountTokensAndEnforcesRBAC(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	ns := newNamespace(t)
	must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "robot"}}))
	robot, err := clientsetAs(ctx, ns, "robot")
	must(t, err)

	review, err := robot.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	must(t, err)
	if want := "system:serviceaccount:" + ns + ":robot"; review.Status.UserInfo.Username != want {
		t.Fatalf("token authenticates as %q, want %q", review.Status.UserInfo.Username, want)
	}

	if _, err := robot.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing ConfigMaps without a RoleBinding: want Forbidden, got %v", err)
	}
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "robot-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "robot", Namespace: ns}},
	}))
	eventually(t, "the RoleBinding to allow listing", func() bool {
		_, err := robot.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	if _, err := robot.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing ConfigMaps in another namespace: want Forbidden, got %v", err)
	}
}

func TestClusterRunsPodsOnFakeNodesWithPodCIDRs(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	nodes := &corev1.NodeList{}
	must(t, admin.List(ctx, nodes))
	if len(nodes.Items) == 0 {
		t.Fatal("the cluster has no nodes")
	}
	for _, n := range nodes.Items {
		if n.Spec.PodCIDR == "" {
			t.Errorf("node %s has no spec.podCIDR", n.Name)
		}
	}
	ns := newNamespace(t)
	labels := map[string]string{"app": "web"}
	must(t, admin.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1"}}},
			},
		},
	}))
	eventually(t, "two Running pods", func() bool {
		pods := &corev1.PodList{}
		if err := admin.List(ctx, pods, client.InNamespace(ns)); err != nil {
			return false
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
				running++
			}
		}
		return running == 2
	})
}

// newNamespace creates a namespace for one test, named after it, and deletes it when the test
// ends (deleteNamespace): the finalizers of its objects are served by the managers the test
// started before it (they stop after this cleanup), never left to another test's.
func newNamespace(t *testing.T) string {
	t.Helper()
	return newNamespaceWith(t, nil)
}

// newKyvernoNamespace is newNamespace for a test that runs Kyverno: labelled so that Kyverno's
// webhooks see it (kyverno.OnlyLabelledNamespaces).
func newKyvernoNamespace(t *testing.T) string {
	t.Helper()
	return newNamespaceWith(t, kyverno.NamespaceLabels())
}

// newNamespaceWith is newNamespace with labels.
func newNamespaceWith(t *testing.T, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaceName("qm-e2e-", t.Name()), Labels: labels}}
	must(t, admin.Create(context.Background(), ns))
	t.Cleanup(func() { deleteNamespace(t, ns.Name) })
	return ns.Name
}

// namespaceName is a DNS label made of prefix and name: lower case, [a-z0-9-], at most 63
// characters; a name cut short ends in a hash of the whole, so two long names stay apart.
func namespaceName(prefix, name string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	full := strings.Trim(b.String(), "-")
	if len(full) <= 63 {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	return strings.TrimRight(full[:63-9], "-") + "-" + hex.EncodeToString(sum[:])[:8]
}

// finalized are the kinds whose controllers hold their objects with a finalizer until the outside
// is clean (iam.Finalizer: the AWS objects; vmgroups.Finalizer: the VMs): only a manager running
// that controller lets them go.
var finalized = []schema.GroupVersionKind{
	iamv1alpha1.GroupVersion.WithKind("IAMPolicy"),
	iamv1alpha1.GroupVersion.WithKind("IAMServiceAccount"),
	computev1alpha1.GroupVersion.WithKind("VmGroup"),
}

// finalizersServed bounds the wait for a deleted namespace's finalized objects to go.
const finalizersServed = 3 * time.Minute

// deleteNamespace deletes the namespace, then at once its pods (kwok runs no container to stop)
// and its objects of the finalized kinds, and waits until those are gone: their finalizers
// served by the managers that run now. It fails the test with what is left. The rest, which no
// manager holds, the namespace controller removes in its own time: nothing waits for it.
func deleteNamespace(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); apierrors.IsNotFound(err) {
		return
	} else if err != nil {
		t.Errorf("deleting the namespace %s: %v", name, err)
		return
	}
	// After the namespace: being deleted, it takes no new object from a controller.
	if err := admin.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(name), client.GracePeriodSeconds(0)); err != nil {
		t.Errorf("deleting the pods of the namespace %s: %v", name, err)
	}
	for _, gvk := range finalized {
		obj := &unstructured.Unstructured{}
		obj.SetGroupVersionKind(gvk)
		if err := admin.DeleteAllOf(ctx, obj, client.InNamespace(name)); err != nil {
			t.Errorf("deleting the %ss of the namespace %s: %v", gvk.Kind, name, err)
		}
	}
	testenv.PollFor(t, "the finalized objects of the namespace "+name+" to be gone", 200*time.Millisecond, finalizersServed, func() (bool, string) {
		var left []string
		for _, gvk := range finalized {
			list := &unstructured.UnstructuredList{}
			list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
			if err := admin.List(ctx, list, client.InNamespace(name)); err != nil {
				return false, err.Error()
			}
			for _, o := range list.Items {
				left = append(left, fmt.Sprintf("%s %s (finalizers %v)", gvk.Kind, o.GetName(), o.GetFinalizers()))
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// e2eWait bounds the tests' condition waits: what a busy machine running the tests in parallel
// takes, never a timing the tests assert.
const e2eWait = 2 * time.Minute

// namespaceDeletion bounds a wait that includes a namespace's deletion (awaitDeletion), done by
// the cluster's namespace controller: ten workers, each deleting every namespaced kind of a
// namespace; no batch of hundreds is ahead of it (deletions_test.go).
const namespaceDeletion = 5 * time.Minute

// eventually polls cond every 100 ms (testenv.PollFor) until it holds, failing the test after
// e2eWait.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.PollFor(t, what, 100*time.Millisecond, e2eWait, func() (bool, string) { return cond(), "" })
}
