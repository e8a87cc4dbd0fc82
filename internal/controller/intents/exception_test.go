package intents

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// TestExceptionLifecycle walks a SecurityIntentException through what needs no running Kyverno
// (the e2e runs the real one, which honours it): EngineNotInstalled until Kyverno's kinds are
// served, woken when they are; NothingToExempt until a binding applies the intent in its
// namespace; then the PolicyException the controller writes, with the exception's status and the
// intent's list of its exceptions; and, deleted while no manager runs, its PolicyException deleted
// by the next manager's sweep.
func TestExceptionLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := start(t) // an API server of its own: Kyverno is installed late, and the manager stopped
	f.namespace(t, "exc")
	f.namespace(t, testExceptions.Namespace)
	f.intent(t, "exc-escape", "escapeToHost", nil)
	expires := metav1.NewTime(time.Now().Add(3 * time.Hour).Truncate(time.Second))
	exc := &securityv1alpha1.SecurityIntentException{
		ObjectMeta: metav1.ObjectMeta{Namespace: "exc", Name: "legacy"},
		Spec: securityv1alpha1.SecurityIntentExceptionSpec{Intent: "exc-escape", Owner: "team-web", Reason: "a vendor image needs it",
			Expires: expires, Workloads: securityv1alpha1.ExemptedWorkloads{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"legacy": "true"}}}},
	}
	must(t, f.c.Create(ctx, exc))
	waitReason := func(t *testing.T, reason string) {
		t.Helper()
		waitReasonOf(t, f, exc, reason)
	}
	peKey := client.ObjectKey{Namespace: testExceptions.Namespace, Name: "exc.legacy"}
	policyException := func() (*unstructured.Unstructured, error) {
		pe := &unstructured.Unstructured{}
		pe.SetGroupVersionKind(intent.PolicyExceptionKind)
		return pe, f.c.Get(ctx, peKey, pe)
	}

	t.Run("Kyverno not installed: waiting for it", func(t *testing.T) {
		waitReason(t, "EngineNotInstalled")
	})
	t.Run("Kyverno installed, the intent not bound in the namespace: nothing to exempt", func(t *testing.T) {
		f.installKyvernoCRDs(t, "config/crds/kyverno/kyverno.io_policyexceptions.yaml")
		f.installKyverno(t)
		waitReason(t, "NothingToExempt") // woken when Kyverno appeared, not at the 5-minute recheck
		if _, err := policyException(); !apierrors.IsNotFound(err) {
			t.Errorf("nothing to exempt, but a PolicyException: %v", err)
		}
	})
	t.Run("bound: Kyverno's PolicyException from the binding's policy, in the exception namespace", func(t *testing.T) {
		f.binding(t, "exc", "web", map[string]string{"app": "web"}, "exc-escape")
		waitReason(t, "Exempting")
		pe, err := policyException()
		must(t, err)
		spec, _, _ := unstructured.NestedMap(pe.Object, "spec")
		want := map[string]any{
			"background": true,
			"exceptions": []any{map[string]any{"policyName": "exc/web-escapetohost", "ruleNames": []any{"*"}}},
			"match": map[string]any{"any": []any{map[string]any{"resources": map[string]any{
				"namespaces": []any{"exc"}, "selector": map[string]any{"matchLabels": map[string]any{"legacy": "true"}}}}}},
		}
		if fmt.Sprint(spec) != fmt.Sprint(want) {
			t.Errorf("PolicyException spec\n%v\nwant\n%v", spec, want)
		}
		if a := pe.GetAnnotations(); a[intent.ExceptionAnnotation] != "exc/legacy" || a["security.quartermaster.dev/owner"] != "team-web" {
			t.Errorf("PolicyException annotations %v", a)
		}
		if exc.Status.PolicyException != peKey.String() || fmt.Sprint(exc.Status.Policies) != "[KyvernoPolicy/exc/web-escapetohost]" || exc.Status.Exempted != nil {
			t.Errorf("status %+v: want the PolicyException, the policy, and no exempted count (Kyverno's reports are not served)", exc.Status)
		}
		si := &intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: "exc-escape"}}
		eventually(t, "the intent to list its exception", func() (bool, string) {
			f.get(t, si)
			got := fmt.Sprintf("%+v", si.Status.Exceptions)
			return len(si.Status.Exceptions) == 1 && si.Status.Exceptions[0].Name == "exc/legacy" && si.Status.Exceptions[0].Owner == "team-web" &&
				si.Status.Exceptions[0].Expires.Equal(&expires) && si.Status.Exceptions[0].State == "Exempting", got
		})
	})
	t.Run("it ends at its expiry by itself: ExpiresSoon, then Expired, the PolicyException deleted", func(t *testing.T) {
		// Exempting for a second and more, then in its last hour (--intents-exception-expiry-warning),
		// then expired: each by the requeue the previous state set, with no edit.
		soon := exc.DeepCopy()
		soon.ObjectMeta = metav1.ObjectMeta{Namespace: "exc", Name: "soon"}
		soon.Spec.Expires = metav1.NewTime(time.Now().Add(testExceptions.Warning + 3*time.Second).Truncate(time.Second))
		must(t, f.c.Create(ctx, soon))
		waitReasonOf(t, f, soon, "Exempting")
		waitReasonOf(t, f, soon, "ExpiresSoon")
		pe := &unstructured.Unstructured{}
		pe.SetGroupVersionKind(intent.PolicyExceptionKind)
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: testExceptions.Namespace, Name: "exc.soon"}, pe))
		// Moved to a few seconds from now, it expires while no manager runs: the next one deletes
		// its PolicyException when it starts.
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(soon), soon))
		soon.Spec.Expires = metav1.NewTime(time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second))
		must(t, f.c.Update(ctx, soon))
		waitReasonOf(t, f, soon, "ExpiresSoon")
		f.stop(t)
		time.Sleep(time.Until(soon.Spec.Expires.Time)) // the clock the expiry is about, not a settling delay
		f.run(t)
		waitReasonOf(t, f, soon, "Expired")
		if err := f.c.Get(ctx, client.ObjectKeyFromObject(pe), pe); !apierrors.IsNotFound(err) {
			t.Errorf("the expired exception's PolicyException: %v; want it deleted", err)
		}
		if c := meta.FindStatusCondition(soon.Status.Conditions, status.Stalled); c == nil || c.Status != metav1.ConditionTrue ||
			!strings.Contains(c.Message, "owner team-web") {
			t.Errorf("Stalled condition %+v; want True naming the owner", c)
		}
	})
	t.Run("deleted while no manager runs: the next manager's sweep deletes its PolicyException", func(t *testing.T) {
		f.stop(t)
		must(t, f.c.Delete(ctx, exc))
		f.run(t)
		eventually(t, "the PolicyException deleted", func() (bool, string) {
			_, err := policyException()
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
}

// waitReasonOf waits until exc's Ready reason, at its generation, is reason.
func waitReasonOf(t *testing.T, f *fixture, exc *securityv1alpha1.SecurityIntentException, reason string) {
	t.Helper()
	eventually(t, "the exception "+exc.Name+" "+reason, func() (bool, string) {
		f.get(t, exc)
		c := meta.FindStatusCondition(exc.Status.Conditions, status.Ready)
		return c != nil && c.Reason == reason && c.ObservedGeneration == exc.Generation, fmt.Sprintf("%+v", c)
	})
}

// TestExceptionsTurnedOff: a manager restarted without --intents-exception-namespace leaves no
// PolicyException in force (its sweep deletes them), and its exceptions say why they exempt nothing.
func TestExceptionsTurnedOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := start(t) // an API server of its own: Kyverno is installed, and the manager reconfigured
	f.namespace(t, "off")
	f.namespace(t, testExceptions.Namespace)
	f.installKyvernoCRDs(t, "config/crds/kyverno/kyverno.io_policyexceptions.yaml")
	f.installKyverno(t)
	f.intent(t, "off-escape", "escapeToHost", nil)
	f.binding(t, "off", "web", map[string]string{"app": "web"}, "off-escape")
	exc := &securityv1alpha1.SecurityIntentException{
		ObjectMeta: metav1.ObjectMeta{Namespace: "off", Name: "legacy"},
		Spec: securityv1alpha1.SecurityIntentExceptionSpec{Intent: "off-escape", Owner: "team-web", Reason: "a vendor image needs it",
			Expires: metav1.NewTime(time.Now().Add(3 * time.Hour)), Workloads: securityv1alpha1.ExemptedWorkloads{Selector: metav1.LabelSelector{MatchLabels: map[string]string{"legacy": "true"}}}},
	}
	must(t, f.c.Create(ctx, exc))
	waitReasonOf(t, f, exc, "Exempting")
	f.stop(t)
	f.exceptions.Namespace = ""
	f.run(t)
	waitReasonOf(t, f, exc, "ExceptionsDisabled")
	eventually(t, "the PolicyException deleted by the sweep", func() (bool, string) {
		pe := &unstructured.Unstructured{}
		pe.SetGroupVersionKind(intent.PolicyExceptionKind)
		err := f.c.Get(ctx, client.ObjectKey{Namespace: testExceptions.Namespace, Name: "off.legacy"}, pe)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}
