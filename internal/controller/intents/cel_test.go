package intents

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// testCEL: a binding's spec.cel adds the labels it requires to the selector of everything it
// generates; an expression that cannot be a selector stalls the binding and keeps what it made.
func testCEL(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := f.env.Namespace(t)
	dns := f.intent(t, unique("cel-dns"), "dnsManipulation", nil)
	sib := &intentv1alpha1.SecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: intentv1alpha1.SecurityIntentBindingSpec{
			Intents: []intentv1alpha1.MatchIntent{{Name: dns.Name}},
			CEL:     []string{`labels["app"] == "nginx" && labels["tier"] == "web"`},
		},
	}
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}}
	policies := []string{"KubeArmorPolicy/web-dnsmanipulation", "NetworkPolicy/web-dnsmanipulation"}
	selectorIs := func(t *testing.T, want map[string]string) {
		t.Helper()
		if !maps.Equal(np.Spec.Selector.MatchLabels, want) {
			t.Errorf("NimbusPolicy selector %v, want %v", np.Spec.Selector.MatchLabels, want)
		}
		ksp, err := f.engineObject("KubeArmorPolicy", ns, "web-dnsmanipulation")
		must(t, err)
		got, _, _ := unstructured.NestedStringMap(ksp.Object, "spec", "selector", "matchLabels")
		if !maps.Equal(got, want) {
			t.Errorf("KubeArmorPolicy selector %v, want %v", got, want)
		}
	}

	t.Run("admission: cel alone selects; an empty expression is refused", func(t *testing.T) {
		empty := sib.DeepCopy()
		empty.Name, empty.Spec.CEL = "empty", []string{""}
		if err := f.c.Create(ctx, empty); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.cel[0]") {
			t.Errorf("Create = %v, want Invalid naming spec.cel[0]", err)
		}
		must(t, f.c.Create(ctx, sib))
	})

	t.Run("the labels the expressions require become the selector", func(t *testing.T) {
		f.waitPolicyStatus(t, np, "Generated", policies...)
		selectorIs(t, map[string]string{"app": "nginx", "tier": "web"})
	})

	t.Run("with matchLabels, both apply", func(t *testing.T) {
		f.get(t, sib)
		base := sib.DeepCopy()
		sib.Spec.Selector.WorkloadSelector.MatchLabels = map[string]string{"env": "prod"}
		sib.Spec.CEL = []string{`labels.app == "nginx"`, `labels["tier"] in ["web"]`}
		must(t, f.c.Patch(ctx, sib, client.MergeFrom(base))) // the controller writes its status meanwhile
		eventually(t, "the NimbusPolicy's new selector", func() (bool, string) {
			f.get(t, np)
			return len(np.Spec.Selector.MatchLabels) == 3, fmt.Sprint(np.Spec.Selector.MatchLabels)
		})
		f.waitPolicyStatus(t, np, "Generated", policies...)
		selectorIs(t, map[string]string{"app": "nginx", "tier": "web", "env": "prod"})
	})

	t.Run("an expression that is no selector stalls the binding, naming it, and keeps the policies", func(t *testing.T) {
		rv := np.ResourceVersion
		f.get(t, sib)
		base := sib.DeepCopy()
		sib.Spec.CEL = []string{`labels["app"] == "nginx"`, `labels["tier"] != "db"`}
		must(t, f.c.Patch(ctx, sib, client.MergeFrom(base))) // the controller writes its status meanwhile
		eventually(t, "the binding Stalled InvalidCEL", func() (bool, string) {
			f.get(t, sib)
			c := meta.FindStatusCondition(sib.Status.Conditions, "Stalled")
			return c != nil && c.Status == metav1.ConditionTrue && c.Reason == "InvalidCEL" && c.ObservedGeneration == sib.Generation, fmt.Sprint(c)
		})
		c := meta.FindStatusCondition(sib.Status.Conditions, "Stalled")
		if !strings.Contains(c.Message, `cel[1] "labels[\"tier\"] != \"db\""`) || !strings.Contains(c.Message, "left as it was") {
			t.Errorf("Stalled message %q", c.Message)
		}
		if sib.Status.NimbusPolicy != "web" {
			t.Errorf("status.nimbusPolicy = %q: the policy still exists", sib.Status.NimbusPolicy)
		}
		f.get(t, np)
		if np.ResourceVersion != rv {
			t.Errorf("the NimbusPolicy was rewritten")
		}
		selectorIs(t, map[string]string{"app": "nginx", "tier": "web", "env": "prod"})
	})

	t.Run("fixed, the binding is Ready again", func(t *testing.T) {
		f.get(t, sib)
		base := sib.DeepCopy()
		sib.Spec.CEL = []string{`labels["app"] == "nginx"`}
		must(t, f.c.Patch(ctx, sib, client.MergeFrom(base))) // the controller writes its status meanwhile
		eventually(t, "the binding Ready", func() (bool, string) {
			f.get(t, sib)
			c := meta.FindStatusCondition(sib.Status.Conditions, "Ready")
			return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == sib.Generation, fmt.Sprint(c)
		})
		f.waitPolicyStatus(t, np, "Generated", policies...)
		selectorIs(t, map[string]string{"app": "nginx", "env": "prod"})
	})
}
