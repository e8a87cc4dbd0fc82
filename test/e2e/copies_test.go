//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// TestSharedObjectsAreCopiedAsTheNamespacesAdmin: with the manager under its generated RBAC (no
// Secret access outside its requests namespace) and the copy-source ClusterRole bound in the
// sources' namespace only, a requested namespace gets the marked pull Secret, written with the
// namespace's admin token (the real admin ClusterRole, aggregated by the controller-manager).
func TestSharedObjectsAreCopiedAsTheNamespacesAdmin(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	const from, name = "e2e-shared", "e2e-copies"
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: from}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: from, Name: "quartermaster-namespaces-copy-source"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "quartermaster-namespaces-copy-source"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "quartermaster-manager", Namespace: managerNamespace}},
		},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: from, Name: "registry-pull", Labels: map[string]string{nsrequest.LabelCopySource: "true"}},
			Type:       corev1.SecretTypeDockerConfigJson,
			Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)},
		},
	} {
		must(t, admin.Create(ctx, obj))
	}
	t.Cleanup(func() { deleteNamespace(t, from) })
	defaults := filepath.Join(t.TempDir(), "defaults.yaml")
	must(t, os.WriteFile(defaults, []byte("copy:\n  secrets: [registry-pull]\n"), 0o600))
	requests := newRequestsNamespace(t)
	startManager(t, "--controllers=namespaces", "--health-probe-bind-address=0", "--namespace-defaults="+defaults, "--copy-from-namespace="+from,
		"--requests-namespace="+requests)

	requestNamespace(t, requests, name, nil)
	waitReady(t, requests, name)
	copied := &corev1.Secret{}
	must(t, admin.Get(ctx, client.ObjectKey{Namespace: name, Name: "registry-pull"}, copied))
	if copied.Type != corev1.SecretTypeDockerConfigJson || string(copied.Data[corev1.DockerConfigJsonKey]) != `{"auths":{}}` {
		t.Errorf("copy = %+v", copied)
	}
	// The manager itself may not touch Secrets there: the copy was written as the namespace's admin.
	for _, verb := range []string{"get", "create"} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:" + managerNamespace + ":quartermaster-manager",
			Groups:             []string{"system:serviceaccounts", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: name, Verb: verb, Resource: "secrets"},
		}}
		must(t, admin.Create(ctx, sar))
		if sar.Status.Allowed {
			t.Errorf("the manager may %s Secrets in %s", verb, name)
		}
	}
}
