//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// These tests prove the local cluster has what envtest lacks and what the controllers rely on.

func TestClusterGarbageCollectsDependents(t *testing.T) {
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
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "qm-e2e-nsdel-"}}
	must(t, admin.Create(ctx, ns))
	must(t, admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "content"}}))
	must(t, admin.Delete(ctx, ns))
	eventuallyWithin(t, "the namespace to be gone", namespaceDeletion, func() bool {
		return apierrors.IsNotFound(admin.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}))
	})
}

func TestClusterIssuesServiceAccountTokensAndEnforcesRBAC(t *testing.T) {
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

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := "qm-e2e-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	name = strings.TrimRight(name, "-")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	must(t, admin.Create(context.Background(), ns))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), ns) })
	return name
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, what, 90*time.Second, cond)
}

// namespaceDeletion bounds a wait that includes a namespace's deletion, done by the cluster's
// namespace controller: ten workers, each deleting every namespaced kind of a namespace, minutes
// behind on a busy machine after hundreds of namespaces went at once (the requests of the failover
// and upgrade tests).
const namespaceDeletion = 5 * time.Minute

// eventuallyWithin is eventually with a limit of its own, for what takes longer by design.
func eventuallyWithin(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, limit, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("timed out after %s waiting for %s", limit, what)
	}
}
