package intents

import (
	"context"
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// TestDeferredReports: a pass that wrote engine policies for a cluster binding's NimbusPolicy
// holds its report until the binding is enforced (its pass over the namespaces ended, every
// NimbusPolicy it created passed once); the held ones are then reconciled again, and that pass
// gets what the passes before it made and changed.
func TestDeferredReports(t *testing.T) {
	t.Parallel()
	const binding = types.UID("binding-uid")
	np := func(name string, uid types.UID) *intentv1alpha1.NimbusPolicy {
		return &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: intentv1alpha1.GroupVersion.String(), Kind: "ClusterSecurityIntentBinding",
				Name: "b", UID: binding, Controller: new(true)}}}}
	}
	key := func(p *intentv1alpha1.NimbusPolicy) types.NamespacedName {
		return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	}
	wrote := intent.Applied{Entries: []string{"NetworkPolicy/p"}, Changes: []string{"created NetworkPolicy p"}}
	// Before the policy controller starts (no queue), what is released waits in unsent.
	released := func(d *deferredReports, n int) []string {
		t.Helper()
		var names []string
		for _, k := range d.unsent {
			names = append(names, k.Name)
		}
		if len(names) != n {
			t.Errorf("released %v, want %d", names, n)
		}
		d.unsent = nil
		return names
	}

	t.Run("no binding writing: reports at once", func(t *testing.T) {
		d := newDeferredReports()
		if d.passed(np("a", "1"), pendingReport{}, wrote, nil) {
			t.Fatal("held a report with no binding writing")
		}
	})

	t.Run("held until the pass ends and what it created has passed", func(t *testing.T) {
		d := newDeferredReports()
		done := d.writingFor(binding)
		a, b, c := np("a", "1"), np("b", "2"), np("c", "3")
		for _, p := range []*intentv1alpha1.NimbusPolicy{a, b, c} {
			created := d.creating(binding, key(p))
			created(p != c) // c existed: not created
		}
		if !d.passed(a, d.unreported(a), wrote, nil) {
			t.Fatal("a's pass during the binding's: not held")
		}
		if !d.passed(a, d.unreported(a), wrote, nil) { // a again: held once, both passes kept
			t.Fatal("a's second pass: not held")
		}
		if d.passed(c, d.unreported(c), intent.Applied{Entries: wrote.Entries}, nil) {
			t.Fatal("a pass that wrote nothing: held")
		}
		done()
		if len(d.unsent) > 0 {
			t.Fatalf("released %v with b's first pass still to come", d.unsent)
		}
		if d.passed(b, d.unreported(b), wrote, nil) {
			t.Fatal("b's pass, the last the binding awaited, enforces it: held")
		}
		if got := released(d, 1); !slices.Equal(got, []string{"a"}) {
			t.Errorf("released %v, want [a] (held once though it passed twice)", got)
		}
		if got := d.unreported(a); len(got.changes) != 2 || len(got.entries) != 1 {
			t.Errorf("a's report pass got %+v, want both passes' changes and what they made", got)
		}
		if d.passed(a, pendingReport{}, wrote, nil) {
			t.Error("a pass after the binding is enforced: held")
		}
		if len(d.bindings) != 0 || len(d.pending) != 0 {
			t.Errorf("left: bindings %v, pending %v", d.bindings, d.pending)
		}
	})

	t.Run("a second pass of the binding waits for what the first created", func(t *testing.T) {
		d := newDeferredReports()
		a, b := np("a", "1"), np("b", "2")
		done := d.writingFor(binding)
		d.creating(binding, key(a))(true)
		d.creating(binding, key(b))(true)
		done()
		done = d.writingFor(binding)
		d.creating(binding, key(a))(false) // found as the first pass made it
		d.creating(binding, key(b))(false)
		done()
		if !d.passed(a, pendingReport{}, wrote, nil) {
			t.Fatal("a's first pass, with b's to come: not held")
		}
		if d.passed(b, pendingReport{}, wrote, nil) {
			t.Fatal("b's first pass, the last awaited: held")
		}
		if got := released(d, 1); !slices.Equal(got, []string{"a"}) {
			t.Errorf("released %v, want [a]", got)
		}
	})

	t.Run("a failed pass reports, and counts as passed", func(t *testing.T) {
		d := newDeferredReports()
		done := d.writingFor(binding)
		a := np("a", "1")
		d.creating(binding, key(a))(true)
		done()
		if d.passed(a, pendingReport{}, wrote, errors.New("the API server is away")) {
			t.Fatal("a failed pass: held")
		}
		if len(d.bindings) != 0 {
			t.Errorf("the binding is not enforced after its only NimbusPolicy's pass: %+v", d.bindings[binding])
		}
	})

	t.Run("a NimbusPolicy gone is not waited for", func(t *testing.T) {
		d := newDeferredReports()
		done := d.writingFor(binding)
		a, b := np("a", "1"), np("b", "2")
		d.creating(binding, key(a))(true)
		d.creating(binding, key(b))(true)
		if !d.passed(a, pendingReport{}, wrote, nil) {
			t.Fatal("a's pass: not held")
		}
		done()
		d.forget(key(b))
		if got := released(d, 1); !slices.Equal(got, []string{"a"}) {
			t.Errorf("released %v, want [a]", got)
		}
	})

	t.Run("a NimbusPolicy made anew under the same name reports its own", func(t *testing.T) {
		d := newDeferredReports()
		done := d.writingFor(binding)
		_ = d.passed(np("a", "1"), pendingReport{}, wrote, nil)
		done()
		released(d, 1)
		if got := d.unreported(np("a", "2")); len(got.entries) != 0 || len(got.changes) != 0 {
			t.Errorf("the new NimbusPolicy got %+v, the old one's", got)
		}
	})

	t.Run("released into the policy controller's queue once it started", func(t *testing.T) {
		d := newDeferredReports()
		done := d.writingFor(binding)
		_ = d.passed(np("a", "1"), pendingReport{}, wrote, nil)
		done() // before the controller started
		q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
		defer q.ShutDown()
		if err := d.released().Start(context.Background(), q); err != nil {
			t.Fatal(err)
		}
		done = d.writingFor(binding)
		_ = d.passed(np("b", "2"), pendingReport{}, wrote, nil)
		done() // after
		var got []string
		for q.Len() > 0 {
			item, _ := q.Get()
			got = append(got, item.Name)
			q.Done(item)
		}
		if slices.Sort(got); !slices.Equal(got, []string{"a", "b"}) || len(d.unsent) != 0 {
			t.Errorf("queued %v (unsent %v), want [a b]", got, d.unsent)
		}
	})
}
