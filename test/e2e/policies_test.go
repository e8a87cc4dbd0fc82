//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// waitForManagerPolicies returns once the API server enforces the manager's admission policies
// just applied from config/rbac: it loads them from a watch shortly after they are created, and a
// test that runs first would otherwise see its escape allowed. Each probe is a dry run, as the
// manager, of a write its policy refuses.
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
	dryRun := []string{metav1.DryRunAll}
	probes := map[string]func() error{
		prefix + "-manager-scope": func() error {
			_, err := asManager.CoreV1().ResourceQuotas("kube-system").Create(ctx, &corev1.ResourceQuota{
				ObjectMeta: metav1.ObjectMeta{Name: "qm-policy-probe"},
			}, metav1.CreateOptions{DryRun: dryRun})
			return err
		},
		prefix + "-manager-namespaces": func() error {
			_, err := asManager.CoreV1().Namespaces().Patch(ctx, "kube-node-lease", types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"quartermaster.dev/managed-by":"quartermaster"}}}`), metav1.PatchOptions{DryRun: dryRun})
			return err
		},
		prefix + "-manager-workloads": func() error {
			ds := &appsv1.DaemonSet{
				ObjectMeta: metav1.ObjectMeta{Name: "qm-policy-probe"},
				Spec: appsv1.DaemonSetSpec{
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"probe": "true"}},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"probe": "true"}},
						Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "probe", Command: []string{"sh"}}}},
					},
				},
			}
			_, err := asManager.AppsV1().DaemonSets(mirrorsNamespace).Create(ctx, ds, metav1.CreateOptions{DryRun: dryRun})
			return err
		},
	}
	for policy, probe := range probes {
		var last error
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			last = probe()
			return last != nil && strings.Contains(last.Error(), policy), nil
		})
		if err != nil {
			return fmt.Errorf("admission policy %s is not enforced after a minute (last answer: %w)", policy, last)
		}
	}
	return nil
}
