package intents

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// testClusterBindingFailingNamespace: one namespace whose NimbusPolicy the API server refuses (its
// quota of NimbusPolicies is used up) and one where a hand-made NimbusPolicy is in the way do not
// stop a cluster binding from writing the others'; its status names both, and the refused one is
// written once the quota allows it, by the binding's retries alone (nothing it watches changes).
//
// The failing namespaces sort first: the binding used to write the namespaces one after another, in
// name order, and stop at the first error.
func testClusterBindingFailingNamespace(t *testing.T, f *fixture) {
	ctx := context.Background()
	refused, conflict := unique("cb-a-refused"), unique("cb-b-conflict")
	ok := []string{unique("cb-c-ok"), unique("cb-d-ok"), unique("cb-e-ok")}
	for _, ns := range append([]string{refused, conflict}, ok...) {
		f.namespace(t, ns)
	}
	binding := unique("spread")
	name := intent.ClusterPolicyNamePrefix + binding
	si := f.intent(t, unique("no-egress"), intent.DenyExternalNetworkAccess, nil)

	// The quota: no NimbusPolicy in refused (its status as the quota controller, absent here, would
	// write it). Admission sees a new quota a moment later: wait for a refusal.
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: refused, Name: "no-nimbuspolicies"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/nimbuspolicies.intent.security.nimbus.com": resource.MustParse("0")}},
	}
	must(t, f.c.Create(ctx, quota))
	quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{"count/nimbuspolicies.intent.security.nimbus.com": resource.MustParse("0")}}
	must(t, f.c.Status().Update(ctx, quota))
	eventually(t, "the quota refuses NimbusPolicies", func() (bool, string) {
		probe := &intentv1alpha1.NimbusPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: refused, Name: "probe"},
			Spec: intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"a": "b"}},
				NimbusRules: []intentv1alpha1.NimbusRules{{ID: intent.DenyExternalNetworkAccess, Rule: intentv1alpha1.Rule{RuleAction: "Block"}}}},
		}
		err := f.c.Create(ctx, probe)
		if err == nil {
			must(t, f.c.Delete(ctx, probe))
			return false, "admitted"
		}
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"), err.Error()
	})
	// In conflict, a NimbusPolicy of the generated name that someone else made.
	mine := &intentv1alpha1.NimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: conflict, Name: name},
		Spec: intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "mine"}},
			NimbusRules: []intentv1alpha1.NimbusRules{{ID: intent.DenyExternalNetworkAccess, Rule: intentv1alpha1.Rule{RuleAction: "Audit"}}}},
	}
	must(t, f.c.Create(ctx, mine))

	csib := &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{
			Intents: []intentv1alpha1.MatchIntent{{Name: si.Name}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{
				NsSelector:       intentv1alpha1.NamespaceSelector{MatchNames: append([]string{refused, conflict}, ok...)},
				WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			},
		},
	}
	must(t, f.c.Create(ctx, csib))

	t.Run("the others get theirs, and the status names the two", func(t *testing.T) {
		eventually(t, "the binding's status", func() (bool, string) {
			f.get(t, csib)
			c := meta.FindStatusCondition(csib.Status.Conditions, "Ready")
			return c != nil && c.Status == metav1.ConditionFalse && c.ObservedGeneration == csib.Generation &&
					strings.Contains(c.Message, "namespace "+refused+": ") && strings.Contains(c.Message, "exceeded quota") &&
					strings.Contains(c.Message, "NimbusPolicy "+conflict+"/"+name) &&
					slices.Equal(csib.Status.NimbusPolicyNamespaces, ok) && csib.Status.NumberOfNimbusPolicies == int32(len(ok)),
				fmt.Sprintf("%+v", csib.Status)
		})
		if c := meta.FindStatusCondition(csib.Status.Conditions, "Ready"); c.Reason != "Error" {
			t.Errorf("Ready = %+v, want reason Error", c)
		}
		for _, ns := range ok {
			np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			f.waitPolicyStatus(t, np, "Generated", "NetworkPolicy/"+name+"-denyexternalnetworkaccess")
			if !metav1.IsControlledBy(np, csib) {
				t.Errorf("NimbusPolicy %s/%s is not the binding's: %+v", ns, name, np.OwnerReferences)
			}
		}
		err := f.c.Get(ctx, client.ObjectKey{Namespace: refused, Name: name}, &intentv1alpha1.NimbusPolicy{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("NimbusPolicy in %s: %v, want none (refused)", refused, err)
		}
		f.get(t, mine)
		if metav1.GetControllerOf(mine) != nil || mine.Spec.Selector.MatchLabels["app"] != "mine" {
			t.Errorf("the hand-made NimbusPolicy was changed: %+v", mine)
		}
	})

	t.Run("the refused namespace gets its own once the quota allows it", func(t *testing.T) {
		must(t, f.c.Delete(ctx, quota))
		eventually(t, "the binding's status", func() (bool, string) {
			f.get(t, csib)
			c := meta.FindStatusCondition(csib.Status.Conditions, "Ready")
			return c != nil && c.Reason == "Conflict" && !strings.Contains(c.Message, refused) &&
				slices.Equal(csib.Status.NimbusPolicyNamespaces, append([]string{refused}, ok...)), fmt.Sprintf("%+v", csib.Status)
		})
		f.waitPolicyStatus(t, &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: refused, Name: name}},
			"Generated", "NetworkPolicy/"+name+"-denyexternalnetworkaccess")
	})
}

// testClusterBindingEnforcesFirst: the reports of a cluster binding's NimbusPolicies wait until the
// binding is enforced (reports.go): when the first NimbusPolicy reports, every namespace has its
// NimbusPolicy and its NetworkPolicy. (That each reports once, make bench counts: 3 writes per
// namespace.)
func testClusterBindingEnforcesFirst(t *testing.T, f *fixture) {
	ctx := context.Background()
	binding := unique("first")
	name := intent.ClusterPolicyNamePrefix + binding
	var namespaces []string
	for range 20 {
		namespaces = append(namespaces, f.env.Namespace(t))
	}
	si := f.intent(t, unique("first-egress"), intent.DenyExternalNetworkAccess, nil)

	wc, err := client.NewWithWatch(f.env.Config, client.Options{Scheme: f.scheme})
	must(t, err)
	w, err := wc.Watch(ctx, &intentv1alpha1.NimbusPolicyList{}, client.MatchingFields{"metadata.name": name})
	must(t, err)
	defer w.Stop()

	must(t, f.c.Create(ctx, &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: binding},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{
			Intents: []intentv1alpha1.MatchIntent{{Name: si.Name}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{
				NsSelector:       intentv1alpha1.NamespaceSelector{MatchNames: namespaces},
				WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			},
		},
	}))

	created, reports := map[string]bool{}, map[string]bool{}
	var order []string // what the watch saw, for the failure message
	for len(reports) < len(namespaces) {
		select {
		case ev := <-w.ResultChan():
			np, ok := ev.Object.(*intentv1alpha1.NimbusPolicy)
			if !ok {
				t.Fatalf("watch: %+v", ev)
			}
			order = append(order, string(ev.Type)+" "+np.Namespace)
			switch {
			case ev.Type == "ADDED":
				created[np.Namespace] = true
			case meta.IsStatusConditionTrue(np.Status.Conditions, "Ready"):
				if len(created) < len(namespaces) {
					t.Fatalf("NimbusPolicy %s reported with %d of %d NimbusPolicies created; the watch saw %v", np.Namespace, len(created), len(namespaces), order)
				}
				if len(reports) == 0 { // the API server's view once the first report is written
					list := &networkingv1.NetworkPolicyList{}
					must(t, f.c.List(ctx, list))
					enforced := 0
					for _, p := range list.Items {
						if p.Name == intent.PolicyName(name, intent.DenyExternalNetworkAccess) && slices.Contains(namespaces, p.Namespace) {
							enforced++
						}
					}
					if enforced != len(namespaces) {
						t.Fatalf("NimbusPolicy %s reported with %d of %d namespaces' NetworkPolicies made", np.Namespace, enforced, len(namespaces))
					}
				}
				reports[np.Namespace] = true
			}
		case <-time.After(time.Minute):
			t.Fatalf("the watch saw %v within a minute, want every NimbusPolicy created and reported", order)
		}
	}
}
