// Package policies checks the manager's admission policies of config/rbac on envtest's API server:
// make test-unit runs it on the Kubernetes the project runs on, make test-k8s-min on the oldest
// docs/install.md supports (ValidatingAdmissionPolicy v1 with namespaceObject and matchConditions).
// The e2e tests check them on the local cluster, with real ServiceAccount tokens.
package policies

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quartermaster-dev/quartermaster/internal/testing/policyprobe"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestManagerPoliciesAreEnforced applies config/local (CRDs, RBAC, admission policies) and, as the
// manager's ServiceAccount, is refused by each policy, and allowed what the namespaces controller
// does: a quota in a namespace it manages.
func TestManagerPoliciesAreEnforced(t *testing.T) {
	ctx := context.Background()
	env := testenv.Start(t)
	apply := exec.Command(filepath.Join(testenv.Assets(t), "kubectl"), "apply", "--server-side", "-k", "config/local",
		"--kubeconfig", env.KubeconfigFor(t, "admin", "system:masters"))
	apply.Dir = testenv.RepoRoot()
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -k config/local: %v\n%s", err, out)
	}
	// envtest authenticates by client certificate: the manager's ServiceAccount's user name and
	// groups, which its RoleBindings and the policies' matchConditions name.
	user, err := env.AddUser(envtest.User{
		Name:   "system:serviceaccount:quartermaster-system:quartermaster-manager",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:quartermaster-system"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	asManager, err := kubernetes.NewForConfig(user.Config())
	if err != nil {
		t.Fatal(err)
	}
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
}
