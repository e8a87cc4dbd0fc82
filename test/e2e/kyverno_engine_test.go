//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
)

// TestKyvernoHarness proves the harness runs a real Kyverno on the local cluster: a hand-written
// ClusterPolicy becomes Ready and the API server refuses what it forbids with Kyverno's own
// message, through a restart of the admission controller and until the policy is deleted; and the
// background controller generates objects under the RBAC the harness gives it (the chart's).
func TestKyvernoHarness(t *testing.T) {
	parallel(t, kyvernoEngine)
	ctx := context.Background()
	k := kyverno.Start(t, cluster.Config, kyverno.OnlyLabelledNamespaces())
	ns := newKyvernoNamespace(t)

	const policyName = "qm-e2e-baseline-web"
	policy := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
		"metadata": map[string]any{"name": policyName},
		"spec": map[string]any{
			"background": false,
			"rules": []any{map[string]any{
				"name": "baseline",
				"match": map[string]any{"any": []any{map[string]any{"resources": map[string]any{
					"kinds":      []any{"Pod"},
					"namespaces": []any{ns},
					"selector":   map[string]any{"matchLabels": map[string]any{"app": "web"}},
				}}}},
				"validate": map[string]any{
					"failureAction": "Enforce",
					"podSecurity":   map[string]any{"level": "baseline", "version": "latest"},
				},
			}},
		},
	}}
	must(t, admin.Create(ctx, policy))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), policy) })
	k.WaitPolicyReady(t, "", policyName)
	must(t, admin.Get(ctx, client.ObjectKeyFromObject(policy), policy))
	status, _ := json.Marshal(policy.Object["status"])
	t.Logf("the Ready ClusterPolicy's status, as Kyverno %s wrote it: %s", kyverno.Version, status)

	privileged := func(name, app string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "c", Image: "registry.k8s.io/pause:3.10",
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}}},
		}
	}
	refusedByKyverno := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "blocked due to the following policies") && strings.Contains(err.Error(), policyName)
	}
	// The API server applies a webhook configuration a moment after Kyverno writes it: wait for a
	// dry-run refusal, then assert on a real request.
	waitRefused := func() {
		t.Helper()
		eventually(t, "a privileged app=web Pod to be refused by "+policyName+" (dry run)", func() bool {
			return refusedByKyverno(admin.Create(ctx, privileged("probe", "web"), client.DryRunAll))
		})
	}

	t.Run("a privileged Pod labelled app=web is refused with Kyverno's message", func(t *testing.T) {
		waitRefused()
		err := admin.Create(ctx, privileged("web", "web"))
		if !refusedByKyverno(err) {
			t.Fatalf("creating a privileged app=web Pod: %v, want Kyverno's refusal naming %s", err, policyName)
		}
	})
	t.Run("the same Pod labelled app=other is admitted", func(t *testing.T) {
		must(t, admin.Create(ctx, privileged("other", "other")))
	})
	t.Run("its resource webhooks see only the namespaces labelled for it", func(t *testing.T) {
		// What lets the other tests share the cluster: kyverno.OnlyLabelledNamespaces, carried by
		// every webhook Kyverno registered for the policy.
		var vwcs admissionregistrationv1.ValidatingWebhookConfigurationList
		must(t, admin.List(ctx, &vwcs, client.HasLabels{kyverno.WebhookLabel}))
		checked := 0
		for _, w := range vwcs.Items {
			if w.Name != "kyverno-resource-validating-webhook-cfg" {
				continue
			}
			for _, h := range w.Webhooks {
				checked++
				if sel := h.NamespaceSelector; sel == nil || sel.MatchLabels[kyverno.NamespaceLabel] != "on" {
					t.Errorf("Kyverno's webhook %s has namespaceSelector %v, want %s=on", h.Name, sel, kyverno.NamespaceLabel)
				}
			}
		}
		if checked == 0 {
			t.Errorf("no webhook in kyverno-resource-validating-webhook-cfg for the ClusterPolicy %s", policyName)
		}
	})
	t.Run("after a restart of the admission controller the policy is enforced again", func(t *testing.T) {
		k.Restart(t)
		k.WaitPolicyReady(t, "", policyName)
		waitRefused()
		if err := admin.Create(ctx, privileged("web", "web")); !refusedByKyverno(err) {
			t.Fatalf("creating a privileged app=web Pod after the restart: %v, want Kyverno's refusal", err)
		}
	})
	t.Run("after the policy is deleted the privileged app=web Pod is admitted", func(t *testing.T) {
		must(t, admin.Delete(ctx, policy))
		eventually(t, "a privileged app=web Pod to be admitted (dry run)", func() bool {
			return admin.Create(ctx, privileged("probe", "web"), client.DryRunAll) == nil
		})
		must(t, admin.Create(ctx, privileged("web", "web")))
	})

	t.Run("the background controller generates a ConfigMap into new labelled namespaces", func(t *testing.T) {
		const genName = "qm-e2e-generate-configmap"
		gen := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kyverno.io/v1", "kind": "ClusterPolicy",
			"metadata": map[string]any{"name": genName},
			"spec": map[string]any{"rules": []any{map[string]any{
				"name": "configmap",
				"match": map[string]any{"any": []any{map[string]any{"resources": map[string]any{
					"kinds":    []any{"Namespace"},
					"selector": map[string]any{"matchLabels": map[string]any{"qm-e2e-kyverno": "generate"}},
				}}}},
				"generate": map[string]any{
					"apiVersion": "v1", "kind": "ConfigMap", "name": "qm-generated",
					"namespace":   "{{request.object.metadata.name}}",
					"synchronize": true,
					"data":        map[string]any{"data": map[string]any{"generated-by": "kyverno"}},
				},
			}}},
		}}
		must(t, admin.Create(ctx, gen))
		t.Cleanup(func() { _ = admin.Delete(context.Background(), gen) })
		k.WaitPolicyReady(t, "", genName)

		labels := kyverno.NamespaceLabels()
		labels["qm-e2e-kyverno"] = "generate"
		target := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespaceName("", ns+"-gen"), Labels: labels}}
		must(t, admin.Create(ctx, target))
		t.Cleanup(func() { deleteNamespace(t, target.Name) })
		cm := &corev1.ConfigMap{}
		eventually(t, "Kyverno's background controller to generate "+target.Name+"/qm-generated", func() bool {
			return admin.Get(ctx, client.ObjectKey{Namespace: target.Name, Name: "qm-generated"}, cm) == nil
		})
		if cm.Data["generated-by"] != "kyverno" || cm.Labels["generate.kyverno.io/policy-name"] != genName {
			t.Errorf("generated ConfigMap data %v labels %v, want generated-by=kyverno and Kyverno's policy-name label", cm.Data, cm.Labels)
		}
	})

	t.Run("Stop leaves none of Kyverno's webhook configurations behind", func(t *testing.T) {
		k.Stop()
		var vwcs admissionregistrationv1.ValidatingWebhookConfigurationList
		var mwcs admissionregistrationv1.MutatingWebhookConfigurationList
		must(t, admin.List(ctx, &vwcs, client.HasLabels{kyverno.WebhookLabel}))
		must(t, admin.List(ctx, &mwcs, client.HasLabels{kyverno.WebhookLabel}))
		if n := len(vwcs.Items) + len(mwcs.Items); n != 0 {
			t.Errorf("%d of Kyverno's webhook configurations are left after Stop", n)
		}
	})
}
