//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// kyvernoBackgroundRBAC is what Kyverno's background controller needs for the generated policies
// (cocoWorkload's mutate-existing, virtualPatch's KubeArmorPolicy generators), aggregated into
// its ClusterRole by Kyverno's label.
var kyvernoBackgroundRBAC = filepath.Join(testenv.RepoRoot(), "config", "rbac", "intents_kyverno_background.yaml")

// grantKyvernoBackground applies kyvernoBackgroundRBAC and, once Kyverno's aggregated ClusterRole
// exists (kyverno.Start), waits until the authorizer lets the background controller update
// Deployments and create KubeArmorPolicies.
func grantKyvernoBackground(t *testing.T) (wait func()) {
	t.Helper()
	kubectlOK(t, "apply", "-f", kyvernoBackgroundRBAC)
	t.Cleanup(func() { _, _ = cluster.Kubectl(context.Background(), "delete", "-f", kyvernoBackgroundRBAC, "--ignore-not-found") })
	return func() {
		t.Helper()
		as := "--as=system:serviceaccount:" + kyverno.Namespace + ":" + kyverno.BackgroundServiceAccount
		for _, check := range [][]string{{"update", "deployments.apps"}, {"list", "nimbuspolicies.intent.security.nimbus.com"}, {"create", "kubearmorpolicies.security.kubearmor.com"}} {
			eventually(t, "Kyverno's background controller to be allowed to "+check[0]+" "+check[1], func() bool {
				out, err := cluster.Kubectl(context.Background(), "auth", "can-i", check[0], check[1], "--all-namespaces", as)
				return err == nil && strings.TrimSpace(out) == "yes"
			})
		}
	}
}
