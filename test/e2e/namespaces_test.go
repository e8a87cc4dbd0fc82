//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// requestsNamespace is config/local's requests namespace (the controller's default
// --requests-namespace): the tests run their managers on requests namespaces of their own
// (newRequestsNamespace).
const requestsNamespace = "namespace-requests"

// newRequestsNamespace makes a requests namespace of the test's own, as config/local makes
// namespace-requests: the namespace, the namespaces controller's generated Role there (copied from
// namespace-requests) and config/rbac's RoleBinding of it to the manager. A namespaces manager
// started with --requests-namespace set to it (startNamespacesManager) serves this test's requests
// only: the Namespaces it makes carry the requests namespace in their request label. It returns
// once the authorizer lets the manager use it.
func newRequestsNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns := namespaceName("qm-req-", strings.TrimPrefix(t.Name(), "Test"))
	must(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	t.Cleanup(func() { deleteNamespace(t, ns) })
	role := &rbacv1.Role{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: requestsNamespace, Name: "quartermaster-namespaces"}, role))
	must(t, admin.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name, Labels: role.Labels}, Rules: role.Rules}))
	binding := &rbacv1.RoleBinding{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: requestsNamespace, Name: "quartermaster-namespaces"}, binding))
	must(t, admin.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: binding.Name, Labels: binding.Labels},
		RoleRef: binding.RoleRef, Subjects: binding.Subjects}))
	waitAllowed(t, "system:serviceaccount:"+managerNamespace+":quartermaster-manager",
		authorizationv1.ResourceAttributes{Namespace: ns, Verb: "watch", Resource: "configmaps"})
	return ns
}

// waitAllowed waits until the API server's authorizer allows user (a ServiceAccount) attrs: a
// Role just bound is in force a moment later.
func waitAllowed(t *testing.T, user string, attrs authorizationv1.ResourceAttributes) {
	t.Helper()
	eventually(t, user+" to be allowed to "+attrs.Verb+" "+attrs.Resource+" in "+attrs.Namespace, func() bool {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}, ResourceAttributes: &attrs,
		}}
		return admin.Create(context.Background(), sar) == nil && sar.Status.Allowed
	})
}

// startNamespacesManager runs the manager with the namespaces controller on the requests
// namespace requests.
func startNamespacesManager(t *testing.T, requests string) *process {
	t.Helper()
	defaults := filepath.Join(t.TempDir(), "defaults.yaml")
	must(t, os.WriteFile(defaults, []byte("resourceQuota:\n  hard: {pods: \"10\"}\nisolateNetwork: true\n"), 0o600))
	return startManager(t, "--controllers=namespaces", "--health-probe-bind-address=0", "--namespace-defaults="+defaults,
		"--requests-namespace="+requests)
}

// requestNamespace asks for the namespace name in the requests namespace requests; the request
// and the namespace are deleted when the test ends.
func requestNamespace(t *testing.T, requests, name string, data map[string]string) {
	t.Helper()
	must(t, admin.Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: requests, Name: name}, Data: data,
	}))
	leaveNamespaces(t, name)
	t.Cleanup(func() {
		_ = admin.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requests, Name: name}})
	})
}

// requestGone reports whether the namespace name, its request in requests and the request's
// Secret are all gone, and what is left when they are not.
func requestGone(ctx context.Context, requests, name string) (bool, string) {
	if gone, detail := namespaceGone(ctx, name); !gone {
		return false, detail
	}
	key := client.ObjectKey{Namespace: requests, Name: name}
	if err := admin.Get(ctx, key, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		return false, "the request is left (" + testenv.ErrString(err) + ")"
	}
	if err := admin.Get(ctx, key, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		return false, "the Secret is left (" + testenv.ErrString(err) + ")"
	}
	return true, ""
}

// waitReady waits until the request name in requests is Ready and returns its Secret.
func waitReady(t *testing.T, requests, name string) *corev1.Secret {
	t.Helper()
	cm := &corev1.ConfigMap{}
	eventually(t, "request "+requests+"/"+name+" to be Ready", func() bool {
		err := admin.Get(context.Background(), client.ObjectKey{Namespace: requests, Name: name}, cm)
		return err == nil && cm.Annotations[nsrequest.AnnotationStatus] == "Ready"
	})
	s := &corev1.Secret{}
	must(t, admin.Get(context.Background(), client.ObjectKey{Namespace: requests, Name: name}, s))
	return s
}

// clientFromSecret is what the pipeline does with the Secret: use its kubeconfig.
func clientFromSecret(t *testing.T, s *corev1.Secret) *kubernetes.Clientset {
	t.Helper()
	cfg, err := clientcmd.RESTConfigFromKubeConfig(s.Data["kubeconfig"])
	must(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	return cs
}

func TestNamespaceCredentialsWorkInTheirNamespaceOnly(t *testing.T) {
	parallel(t)
	requests := newRequestsNamespace(t)
	startNamespacesManager(t, requests)
	ctx := context.Background()
	other := newNamespace(t)
	requestNamespace(t, requests, "e2e-ci-branch", nil)
	secret := waitReady(t, requests, "e2e-ci-branch")
	pipeline := clientFromSecret(t, secret)

	labels := map[string]string{"app": "web"}
	_, err := pipeline.AppsV1().Deployments("e2e-ci-branch").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web:1",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a Deployment in its own namespace: %v", err)
	}
	forbidden := map[string]error{}
	_, forbidden["a ConfigMap in another namespace"] = pipeline.CoreV1().ConfigMaps(other).Create(ctx,
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	_, forbidden["reading Secrets of the requests namespace"] = pipeline.CoreV1().Secrets(requests).List(ctx, metav1.ListOptions{})
	_, forbidden["a Namespace (cluster-scoped)"] = pipeline.CoreV1().Namespaces().Create(ctx,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-ci-escape"}}, metav1.CreateOptions{})
	_, forbidden["a ClusterRoleBinding (cluster-scoped)"] = pipeline.RbacV1().ClusterRoleBindings().Create(ctx,
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-ci-escape"},
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"}}, metav1.CreateOptions{})
	forbidden["deleting another namespace"] = pipeline.CoreV1().Namespaces().Delete(ctx, other, metav1.DeleteOptions{})
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: want Forbidden, got %v", what, err)
		}
	}

	// The pipeline tears its namespace down; the request and the Secret go with it.
	if _, err := pipeline.CoreV1().Namespaces().Get(ctx, "e2e-ci-branch", metav1.GetOptions{}); err != nil {
		t.Fatalf("getting its own namespace: %v", err)
	}
	if err := pipeline.CoreV1().Namespaces().Delete(ctx, "e2e-ci-branch", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its own namespace: %v", err)
	}
	awaitDeletion(t, "the namespace, the request and the Secret to be gone", func() (bool, string) {
		return requestGone(ctx, requests, "e2e-ci-branch")
	})
}

func TestNamespaceTTLDeletesIt(t *testing.T) {
	parallel(t)
	requests := newRequestsNamespace(t)
	startNamespacesManager(t, requests)
	ctx := context.Background()
	requestNamespace(t, requests, "e2e-ttl", map[string]string{"ttl": "5s"})
	awaitDeletion(t, "the namespace and its request to be deleted after the ttl", func() (bool, string) {
		return requestGone(ctx, requests, "e2e-ttl")
	})
}

func TestNamespaceTokenIsRefreshedBeforeExpiry(t *testing.T) {
	parallel(t)
	requests := newRequestsNamespace(t)
	startNamespacesManager(t, requests)
	ctx := context.Background()
	requestNamespace(t, requests, "e2e-refresh", map[string]string{"token-ttl": "10m"})
	s := waitReady(t, requests, "e2e-refresh")
	old := string(s.Data["token"])
	// Make the recorded issue time 9 minutes ago: 90% of the 10-minute life has passed.
	s.Annotations[nsrequest.AnnotationTokenIssuedAt] = time.Now().Add(-9 * time.Minute).UTC().Format(time.RFC3339)
	must(t, admin.Update(ctx, s))
	eventually(t, "a new token", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(s), s) == nil && string(s.Data["token"]) != old
	})
	review, err := clientFromSecret(t, s).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	must(t, err)
	if want := "system:serviceaccount:e2e-refresh:admin"; review.Status.UserInfo.Username != want {
		t.Errorf("the new token is %q, want %q", review.Status.UserInfo.Username, want)
	}
}

// TestNamespaceRequestsSurviveAManagerKill kills the manager (SIGKILL) while it serves 50
// requests, restarts it, and checks that every request ends served exactly once.
func TestNamespaceRequestsSurviveAManagerKill(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	requests := newRequestsNamespace(t)
	const n = 50
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("e2e-kill-%02d", i)
	}
	first := startNamespacesManager(t, requests)
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() { defer wg.Done(); requestNamespace(t, requests, name, nil) }()
	}
	wg.Wait()
	eventually(t, "some requests to be served", func() bool {
		list := &corev1.SecretList{}
		return admin.List(ctx, list, client.InNamespace(requests)) == nil && len(list.Items) >= 5
	})
	t.Logf("the killed manager exited: %v", first.kill(t))
	served := &corev1.SecretList{}
	must(t, admin.List(ctx, served, client.InNamespace(requests)))
	t.Logf("killed the manager with %d of %d Secrets written", len(served.Items), n)

	startNamespacesManager(t, requests)
	for _, name := range names {
		s := waitReady(t, requests, name)
		sas := &corev1.ServiceAccountList{}
		must(t, admin.List(ctx, sas, client.InNamespace(name)))
		bindings := &rbacv1.RoleBindingList{}
		must(t, admin.List(ctx, bindings, client.InNamespace(name)))
		if len(bindings.Items) != 2 {
			t.Errorf("%s: %d RoleBindings, want 2", name, len(bindings.Items))
		}
		admins := 0
		for _, sa := range sas.Items {
			if sa.Name == "admin" {
				admins++
			}
		}
		if admins != 1 {
			t.Errorf("%s: %d admin ServiceAccounts", name, admins)
		}
		review, err := clientFromSecret(t, s).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil || review.Status.UserInfo.Username != "system:serviceaccount:"+name+":admin" {
			t.Errorf("%s: the Secret's token does not authenticate as its admin (%v)", name, err)
		}
	}
}

// TestManagerCannotMintTokensOutsideItsNamespaces checks the admission policy that narrows the
// manager's cluster-wide token and RBAC permissions to the namespaces it manages.
func TestManagerCannotMintTokensOutsideItsNamespaces(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	asManager, err := clientsetAs(ctx, managerNamespace, "quartermaster-manager")
	must(t, err)

	// Allowed by RBAC, denied by the policy.
	_, err = asManager.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "namespaces it manages") {
		t.Errorf("minting a kube-system token: want a denial by the admission policy, got %v", err)
	}
	_, err = asManager.RbacV1().RoleBindings("kube-system").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "qm-escape"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "quartermaster-manager", Namespace: managerNamespace}},
	}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "namespaces it manages") {
		t.Errorf("binding admin in kube-system: want a denial by the admission policy, got %v", err)
	}
	_, err = asManager.CoreV1().ResourceQuotas("kube-system").Create(ctx, &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "qm-starve"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
	}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "namespaces it manages") {
		t.Errorf("a ResourceQuota in kube-system: want a denial by the admission policy, got %v", err)
	}

	// In a managed namespace: only the admin ServiceAccount.
	requests := newRequestsNamespace(t)
	startNamespacesManager(t, requests)
	requestNamespace(t, requests, "e2e-scope", nil)
	waitReady(t, requests, "e2e-scope")
	// A ServiceAccount of the test's own: the API server looks the account up before admission,
	// so one not there yet (the namespace's "default", which the cluster's controller makes in its
	// own time) answers NotFound, not the policy's denial; seen on CI.
	other := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "e2e-scope", Name: "someone-else"}}
	must(t, admin.Create(ctx, other))
	_, err = asManager.CoreV1().ServiceAccounts("e2e-scope").CreateToken(ctx, other.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "named admin") {
		t.Errorf("minting a token for another ServiceAccount in a managed namespace: want a denial, got %v", err)
	}
}

// TestManagerCannotTakeOverOrDeleteOtherNamespaces checks the admission policy that keeps the
// manager's cluster-wide namespace rights to the namespaces it created: labelling an existing
// namespace as its own (which would open it to the token and RBAC rights above) and deleting one
// it does not manage are refused, while its own work goes on.
func TestManagerCannotTakeOverOrDeleteOtherNamespaces(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	requests := newRequestsNamespace(t)
	asManager, err := clientsetAs(ctx, managerNamespace, "quartermaster-manager")
	must(t, err)

	victim := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-not-quartermasters"}}
	must(t, admin.Create(ctx, victim))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), victim) })
	mergePatch := func(ns, patch string) error {
		_, err := asManager.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	managedBy := `{"metadata":{"labels":{"quartermaster.dev/managed-by":"quartermaster","quartermaster.dev/request":"` +
		nsrequest.RequestLabel(requests, victim.Name) + `"}}}`
	for what, err := range map[string]error{
		// (RBAC grants patch, not update, on namespaces.)
		"labelling an existing namespace as managed (kubectl label ns)": mergePatch(victim.Name, managedBy),
		"deleting a namespace it does not manage":                       asManager.CoreV1().Namespaces().Delete(ctx, victim.Name, metav1.DeleteOptions{}),
		"deleting the requests namespace":                               asManager.CoreV1().Namespaces().Delete(ctx, requests, metav1.DeleteOptions{}),
	} {
		if err == nil || !strings.Contains(err.Error(), "quartermaster-manager-namespaces") {
			t.Errorf("%s: want a denial by the admission policy, got %v", what, err)
		}
	}
	// After the refused label, the token is still refused there.
	_, err = asManager.CoreV1().ServiceAccounts(victim.Name).CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err == nil {
		t.Errorf("minting a token in %s after the label attempts: want a denial", victim.Name)
	}
	got := &corev1.Namespace{}
	must(t, admin.Get(ctx, client.ObjectKeyFromObject(victim), got))
	if got.Labels[nsrequest.LabelManagedBy] != "" || !got.DeletionTimestamp.IsZero() {
		t.Errorf("%s after the refused writes: labels %v, deletion %v", victim.Name, got.Labels, got.DeletionTimestamp)
	}

	// Its own namespaces: annotating is allowed, removing its labels is not, and deleting is.
	startNamespacesManager(t, requests)
	requestNamespace(t, requests, "e2e-own", nil)
	waitReady(t, requests, "e2e-own")
	if err := mergePatch("e2e-own", `{"metadata":{"annotations":{"quartermaster.dev/note":"ok"}}}`); err != nil {
		t.Errorf("annotating a namespace it manages: %v", err)
	}
	if err := mergePatch("e2e-own", `{"metadata":{"labels":{"quartermaster.dev/request":null}}}`); err == nil {
		t.Errorf("removing the request label of a namespace it manages: want a denial")
	}
	if err := asManager.CoreV1().Namespaces().Delete(ctx, "e2e-own", metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting a namespace it manages: %v", err)
	}
}
