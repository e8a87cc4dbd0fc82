package intents

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// TestImpactSaysWhyItIsUnknown walks an intent's impact through the states that need no report
// (the e2e reads the real Kyverno's): an intent no engine scans is NotScanned, naming its
// engines; a scanned one is Unknown — never zero — while Kyverno is not installed, while its
// PolicyReport kind is not served, while its reports controller has never held its Lease or has
// stopped renewing it; and Current as soon as the Lease is held.
func TestImpactSaysWhyItIsUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := start(t) // an API server of its own: Kyverno and its report kinds are installed late
	f.namespace(t, "imp")
	f.intent(t, "imp-dns", "dnsManipulation", nil)
	f.binding(t, "imp", "dns", map[string]string{"app": "web"}, "imp-dns")
	f.intent(t, "imp-escape", "escapeToHost", nil)
	f.binding(t, "imp", "escape", map[string]string{"app": "web"}, "imp-escape")

	impactOf := func(obj client.Object) *intentv1alpha1.Impact {
		f.get(t, obj)
		switch o := obj.(type) {
		case *intentv1alpha1.SecurityIntent:
			return o.Status.Impact
		case *intentv1alpha1.SecurityIntentBinding:
			return o.Status.Impact
		}
		return nil
	}
	waitImpact := func(t *testing.T, obj client.Object, state, message string) {
		t.Helper()
		eventually(t, client.ObjectKeyFromObject(obj).String()+" impact "+state+" saying "+message, func() (bool, string) {
			imp := impactOf(obj)
			if imp == nil {
				return false, "no impact"
			}
			counted := imp.Violations != nil || imp.Scanned != nil
			return imp.State == state && strings.Contains(imp.Message, message) && counted == (state == intentv1alpha1.ImpactCurrent),
				imp.State + ": " + imp.Message
		})
	}
	si := &intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: "imp-escape"}}
	sib := &intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "imp", Name: "escape"}}

	t.Run("an intent no engine scans is NotScanned, naming its engines", func(t *testing.T) {
		for _, obj := range []client.Object{
			&intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: "imp-dns"}},
			&intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "imp", Name: "dns"}},
		} {
			waitImpact(t, obj, intentv1alpha1.ImpactNotScanned, "dnsManipulation (KubeArmor, NetworkPolicy) act on what runs from now on")
		}
	})
	t.Run("Kyverno not installed: Unknown", func(t *testing.T) {
		waitImpact(t, si, intentv1alpha1.ImpactUnknown, "Kyverno is not installed")
		waitImpact(t, sib, intentv1alpha1.ImpactUnknown, "Kyverno is not installed")
	})
	t.Run("Kyverno without its report CRDs: Unknown", func(t *testing.T) {
		f.installKyverno(t)
		waitImpact(t, si, intentv1alpha1.ImpactUnknown, "PolicyReport kind (wgpolicyk8s.io/v1alpha2) is not served")
	})
	t.Run("no reports controller has run: Unknown, naming the Lease", func(t *testing.T) {
		f.installKyvernoCRDs(t, "config/crds/policyreport/wgpolicyk8s.io_policyreports.yaml")
		waitImpact(t, si, intentv1alpha1.ImpactUnknown, "never run here (no Lease kyverno/kyverno-reports-controller")
		waitImpact(t, sib, intentv1alpha1.ImpactUnknown, "never run here")
	})
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kyverno", Name: ReportsControllerLease}}
	t.Run("the reports controller holds its Lease: Current, read from the (empty) reports", func(t *testing.T) {
		f.namespace(t, "kyverno")
		lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("kyverno-reports-controller-0"), LeaseDurationSeconds: ptr.To(int32(3600)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}}
		must(t, f.c.Create(ctx, lease))
		waitImpact(t, si, intentv1alpha1.ImpactCurrent, "Kyverno's reports: 0 of 0 scanned workloads fail KyvernoPolicy/escape-escapetohost")
		waitImpact(t, sib, intentv1alpha1.ImpactCurrent, "0 of 0 scanned")
		if imp := impactOf(si); len(imp.Unreported) != 1 || imp.Unreported[0] != "KyvernoPolicy/escape-escapetohost" || !strings.Contains(imp.Message, "no report names KyvernoPolicy/escape-escapetohost yet") {
			t.Errorf("a policy no report names: %+v", imp)
		}
		// The binding's dnsManipulation half is still said not to be scanned where both are bound.
		if imp := impactOf(&intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "imp", Name: "dns"}}); imp.State != intentv1alpha1.ImpactNotScanned {
			t.Errorf("the dns binding's impact is %s, want NotScanned", imp.State)
		}
	})
	t.Run("the Lease no longer renewed: Unknown, saying since when", func(t *testing.T) {
		f.get(t, lease)
		lease.Spec.LeaseDurationSeconds = ptr.To(int32(15))
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}
		must(t, f.c.Update(ctx, lease))
		waitImpact(t, si, intentv1alpha1.ImpactUnknown, "Kyverno's reports controller is not running (its Lease kyverno/kyverno-reports-controller was last renewed at")
	})
}

// TestCompactReport checks the report cache's transform and the indexes read from it, on a report
// as Kyverno 1.19.1's reports controller writes one (fields from its PolicyReport of a Pod).
func TestCompactReport(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 400)
	report := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "wgpolicyk8s.io/v1alpha2", "kind": "PolicyReport",
		"metadata": map[string]any{"name": "9b1c", "namespace": "shop", "uid": "u1", "resourceVersion": "7",
			"labels":        map[string]any{"app.kubernetes.io/managed-by": "kyverno"},
			"managedFields": []any{map[string]any{"manager": "reports-controller"}}},
		"scope":   map[string]any{"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "p1"},
		"summary": map[string]any{"fail": int64(1), "pass": int64(1)},
		"results": []any{
			map[string]any{"policy": "shop/web-escapetohost", "rule": "pod-security-standard", "result": "fail", "message": long,
				"source": "kyverno", "scored": true, "timestamp": map[string]any{"seconds": int64(1)}, "properties": map[string]any{"process": "background scan"}},
			map[string]any{"policy": "require-labels", "rule": "check", "result": "pass", "message": "ok", "source": "kyverno"},
			map[string]any{"policy": "shop/api-escapetohost", "rule": "pod-security-standard", "result": "skip", "source": "kyverno",
				"message":    "rule is skipped due to policy exception kyverno-exceptions/shop.legacy",
				"properties": map[string]any{"process": "background scan", "exceptions": "shop.legacy"}},
		},
	}}
	got, err := compactReport(report)
	must(t, err)
	u := got.(*unstructured.Unstructured)
	if _, ok := u.Object["summary"]; ok || u.GetManagedFields() != nil || u.GetLabels() != nil {
		t.Errorf("compacted report keeps more than it reads: %v", u.Object)
	}
	if w := workloadOf(u); w != (intentv1alpha1.ImpactedWorkload{Namespace: "shop", Kind: "Pod", Name: "web-1"}) {
		t.Errorf("workload %+v", w)
	}
	results := resultsOf(u)
	if len(results) != 3 || results[0].message != long[:impactMessageMax-3]+"..." || results[0].rule != "pod-security-standard" ||
		results[1] != (reportResult{policy: "require-labels", outcome: "pass"}) ||
		results[2] != (reportResult{policy: "shop/api-escapetohost", outcome: "skip", exceptions: "shop.legacy"}) {
		t.Errorf("results %+v", results)
	}
	if all, failing := reportPolicies(u, false), reportPolicies(u, true); strings.Join(all, ",") != "shop/web-escapetohost,require-labels,shop/api-escapetohost" || strings.Join(failing, ",") != "shop/web-escapetohost" {
		t.Errorf("indexed as %v and failing %v", all, failing)
	}
	// A rescan that changes only the timestamps says the same; a pass becoming a fail does not.
	again, _ := compactReport(report.DeepCopy())
	if !sameVerdicts(u, again.(client.Object)) {
		t.Error("the same report reads as a different verdict")
	}
	changed := report.DeepCopy()
	changed.Object["results"].([]any)[1].(map[string]any)["result"] = "fail"
	after, _ := compactReport(changed)
	if sameVerdicts(u, after.(client.Object)) {
		t.Error("a pass turned fail reads as the same verdict")
	}
	// A pass becoming a skip under an exception is a change too (the exception's exempted count).
	skipped := report.DeepCopy()
	skipped.Object["results"].([]any)[1].(map[string]any)["result"] = "skip"
	after, _ = compactReport(skipped)
	if sameVerdicts(u, after.(client.Object)) {
		t.Error("a pass turned skip reads as the same verdict")
	}
}
