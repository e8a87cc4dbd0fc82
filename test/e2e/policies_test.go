//go:build e2e

package e2e

import (
	"context"

	"github.com/quartermaster-dev/quartermaster/internal/testing/policyprobe"
)

// waitForManagerPolicies returns once the API server enforces the manager's admission policies
// just applied from config/rbac: it loads them from a watch shortly after they are created, and a
// test that runs first would otherwise see its escape allowed.
func waitForManagerPolicies(ctx context.Context) error {
	return waitForPolicies(ctx, managerNamespace, "quartermaster-manager", "quartermaster", mirrorsNamespace)
}

// waitForPolicies is waitForManagerPolicies for a manager installed as the ServiceAccount
// namespace/serviceAccount, whose policies are named PREFIX-manager-…, with its mirrors in
// mirrorsNamespace (the chart's release).
func waitForPolicies(ctx context.Context, namespace, serviceAccount, prefix, mirrorsNamespace string) error {
	asManager, err := clientsetAs(ctx, namespace, serviceAccount)
	if err != nil {
		return err
	}
	return policyprobe.WaitEnforced(ctx, asManager, prefix, mirrorsNamespace)
}
