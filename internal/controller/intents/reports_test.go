package intents

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// TestDeferredReports: a pass that wrote engine policies leaves its report to the next pass, at
// reportPriority, or, while its cluster binding writes, until the binding's pass ends; the report
// pass gets what the passes before it made and changed, and is never put off again.
func TestDeferredReports(t *testing.T) {
	const binding = types.UID("binding-uid")
	np := func(name string, uid types.UID) *intentv1alpha1.NimbusPolicy {
		return &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: intentv1alpha1.GroupVersion.String(), Kind: "ClusterSecurityIntentBinding",
				Name: "b", UID: binding, Controller: new(true)}}}}
	}
	wrote := applied{entries: []string{"NetworkPolicy/p"}, changes: []string{"created NetworkPolicy p"}}

	t.Run("a pass that wrote nothing reports", func(t *testing.T) {
		d := newDeferredReports()
		if _, later := d.later(np("a", "1"), pendingReport{}, applied{entries: wrote.entries}); later {
			t.Fatal("deferred a pass that wrote nothing")
		}
	})

	t.Run("queued behind enforcement, once", func(t *testing.T) {
		d := newDeferredReports()
		a := np("a", "1")
		res, later := d.later(a, d.unreported(a), wrote)
		if !later || res.RequeueAfter == 0 || res.Priority == nil || *res.Priority != reportPriority {
			t.Fatalf("first pass: %+v, %v; want its report queued at priority %d", res, later, reportPriority)
		}
		earlier := d.unreported(a)
		if len(earlier.entries) != 1 || len(earlier.changes) != 1 {
			t.Fatalf("the report pass got %+v, want what the first pass made and changed", earlier)
		}
		// The report pass writes again (someone deleted the policy meanwhile): it reports anyway.
		if _, later := d.later(a, earlier, wrote); later {
			t.Fatal("a report put off twice")
		}
	})

	t.Run("held while its binding writes, released when the pass ends", func(t *testing.T) {
		d := newDeferredReports()
		done := d.writingFor(binding)
		a, b := np("a", "1"), np("b", "2")
		for _, p := range []*intentv1alpha1.NimbusPolicy{a, b, a} { // a twice: held once
			res, later := d.later(p, d.unreported(p), wrote)
			if !later || res.RequeueAfter != 0 || res.Priority != nil {
				t.Fatalf("pass of %s while its binding writes: %+v, %v; want held, no requeue", p.Name, res, later)
			}
		}
		if got := d.unreported(a); len(got.changes) != 2 {
			t.Errorf("a's two held passes left %+v, want both changes", got)
		}
		done()
		var released []string
		for range 2 {
			released = append(released, (<-d.release).Object.GetName())
		}
		if len(released) != 2 || released[0] != "a" || released[1] != "b" {
			t.Errorf("released %v, want [a b]", released)
		}
		if len(d.writing) != 0 {
			t.Errorf("the binding still marked writing: %v", d.writing)
		}
	})

	t.Run("a NimbusPolicy made anew under the same name reports its own", func(t *testing.T) {
		d := newDeferredReports()
		_, _ = d.later(np("a", "1"), pendingReport{}, wrote)
		if got := d.unreported(np("a", "2")); len(got.entries) != 0 || len(got.changes) != 0 {
			t.Errorf("the new NimbusPolicy got %+v, the old one's", got)
		}
	})
}
