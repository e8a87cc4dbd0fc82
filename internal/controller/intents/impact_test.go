package intents

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents/cluster"
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
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kyverno", Name: cluster.ReportsControllerLease}}
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
