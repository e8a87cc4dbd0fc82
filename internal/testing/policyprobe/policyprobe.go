// Package policyprobe tells when the manager's admission policies (config/rbac) are enforced: each
// probe is a dry run, as the manager, of a write its policy refuses, and the refusal must name the
// policy (an RBAC denial would not). The e2e tests wait for them on the local cluster; test/policies
// checks them on envtest's API server, so on the oldest Kubernetes supported too.
package policyprobe

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
	"k8s.io/client-go/kubernetes"
)

// WaitEnforced returns once the API server refuses each probe with its policy, PREFIX-manager-…
// (the API server loads policies from a watch a moment after they are created), or an error after
// a minute. asManager is authenticated as the manager; its mirrors run in mirrorsNamespace.
func WaitEnforced(ctx context.Context, asManager kubernetes.Interface, prefix, mirrorsNamespace string) error {
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
