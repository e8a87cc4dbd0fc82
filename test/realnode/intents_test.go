//go:build e2e

package realnode

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
)

// TestBlockIntentEnforcedByKyvernoPods: the intents controller set to Kyverno alone (chart value
// intents.engines), Kyverno 1.19.1 runs as its chart runs it, as Pods on the
// node from an image made of the binaries the project builds, its webhooks called by the API server
// through its Service. A Block escapeToHost intent bound to app=web is not Ready while Kyverno does
// not run, is Ready once Kyverno has its policy in force, and then the API server refuses a
// privileged app=web Pod with Kyverno's own message, and admits the same Pod labelled otherwise
// (the API server itself allows privileged Pods here: the refusal is Kyverno's).
func TestBlockIntentEnforcedByKyvernoPods(t *testing.T) {
	ctx := context.Background()
	// The cluster's one policy engine is to be Kyverno, as the chart's intents.engines says (TestMain).
	kyverno.InstallCRDs(t, cluster.Config) // its chart's CRDs first, no Kyverno yet
	ns := newNamespace(t, "real-intents")
	si := &intentv1alpha1.SecurityIntent{
		ObjectMeta: metav1.ObjectMeta{Name: "real-escape-block"},
		Spec:       intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: "escapeToHost", Action: "Block"}},
	}
	sib := &intentv1alpha1.SecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-block"},
		Spec: intentv1alpha1.SecurityIntentBindingSpec{
			Intents:  []intentv1alpha1.MatchIntent{{Name: si.Name}},
			Selector: intentv1alpha1.MatchWorkloads{WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
		},
	}
	must(t, admin.Create(ctx, si))
	t.Cleanup(func() { _ = admin.Delete(ctx, si) })
	must(t, admin.Create(ctx, sib))
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sib.Name}}
	eventually(t, "the NimbusPolicy to wait for its engine", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(np), np) == nil &&
			readyReason(np.Status.Conditions) == "False WaitingForEngine"
	})
	// The intent follows its binding: not Ready while Kyverno has not taken the policy in. (Until
	// the manager sees Kyverno's CRDs, an intent no installed engine can enforce says Accepted,
	// "nothing enforces it": docs/intents.md.)
	eventually(t, "the intent to wait for Kyverno", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(si), si) == nil &&
			strings.HasPrefix(readyReason(si.Status.Conditions), "False ")
	})

	k := kyverno.StartPods(t, cluster.Config, func(archive string) error { return cluster.Load("", archive) })
	const policy = "web-block-escapetohost"
	k.WaitPolicyReady(t, ns, policy)
	eventually(t, "the intent to be Ready", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(si), si) == nil && meta.IsStatusConditionTrue(si.Status.Conditions, "Ready")
	})

	refused := func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "blocked due to the following policies") && strings.Contains(err.Error(), policy)
	}
	// The API server applies Kyverno's webhook configuration a moment after Kyverno writes it.
	eventually(t, "a privileged app=web Pod to be refused by Kyverno (dry run)", func() bool {
		return refused(admin.Create(ctx, privilegedPod(ns, "probe", "web"), client.DryRunAll))
	})
	if err := admin.Create(ctx, privilegedPod(ns, "web-1", "web")); !refused(err) {
		t.Fatalf("a privileged app=web Pod: %v, want Kyverno's refusal naming %s", err, policy)
	}
	other := privilegedPod(ns, "other-1", "other")
	must(t, admin.Create(ctx, other))
	eventually(t, "the admitted privileged Pod to run", func() bool {
		return admin.Get(ctx, client.ObjectKeyFromObject(other), other) == nil && other.Status.Phase == corev1.PodRunning
	})
}

func readyReason(conds []metav1.Condition) string {
	if c := meta.FindStatusCondition(conds, "Ready"); c != nil {
		return string(c.Status) + " " + c.Reason
	}
	return ""
}

func privilegedPod(ns, name, app string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "c", Image: "docker.io/local/pause:1", ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}},
		},
	}
}
