//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestIntentExceptionsInKyverno proves SecurityIntentExceptions against the real Kyverno 1.19.1,
// run as its chart runs it with features.policyExceptions (one exception namespace): what the API
// server can check is refused by it; what it cannot (an expiry past or beyond the platform's
// maximum, other namespaces from a namespace the platform has not named, every workload of every
// namespace, a missing intent, an intent no engine with exceptions enforces) is refused by the
// controller, naming the check, with nothing written. An accepted exception becomes Kyverno's own
// PolicyException, which Kyverno honours: its background scan reports the exempted workload
// skipped under it (status.exempted, the impact falls), and with the intent at Block its admission
// admits an exempted privileged Pod while refusing another with its own message. At its expiry the
// controller deletes the PolicyException (ExpiresSoon then Expired, as Warning Events), and the
// workload counts as a violation again; a deleted exception's PolicyException goes with it.
func TestIntentExceptionsInKyverno(t *testing.T) {
	parallel(t, intentsController, kyvernoEngine)
	ctx := context.Background()
	installKubeArmorCRD(t)
	k := kyverno.Start(t, cluster.Config, kyverno.OnlyLabelledNamespaces())
	ns := newKyvernoNamespace(t)
	adminNS := namespaceName("", ns+"-admin")
	must(t, admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: adminNS, Labels: kyverno.NamespaceLabels()}}))
	t.Cleanup(func() { deleteNamespace(t, adminNS) })
	mgr := startManager(t, "--controllers=intents", "--health-probe-bind-address=0",
		"--intents-exception-namespace="+kyverno.ExceptionNamespace, "--intents-exception-max-ttl=48h",
		"--intents-exception-expiry-warning=1h", "--intents-exception-admin-namespaces="+adminNS)

	const (
		escape = "qm-exc-escape"
		dns    = "qm-exc-dns"
		policy = "scan-escapetohost"
	)
	for _, name := range []string{escape, dns} {
		t.Cleanup(func() {
			_, _ = cluster.Kubectl(context.Background(), "delete", "securityintent", name, "--ignore-not-found", "--wait=false")
		})
	}
	// viol-legacy is privileged with a label the exception will select; viol-1 privileged without.
	legacy := privilegedPod(ns, "viol-legacy", "scan")
	legacy.Labels["legacy"] = "true"
	must(t, admin.Create(ctx, legacy))
	must(t, admin.Create(ctx, privilegedPod(ns, "viol-1", "scan")))
	must(t, admin.Create(ctx, compliantPod(ns, "ok-1", "scan")))
	kubectlApply(t, ns, `
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: `+escape+`}
spec: {intent: {id: escapeToHost, action: Audit}}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: `+dns+`}
spec: {intent: {id: dnsManipulation, action: Block}}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntentBinding
metadata: {name: scan}
spec:
  intents: [{name: `+escape+`}]
  selector: {workloadSelector: {matchLabels: {app: scan}}}
`)
	waitImpact(t, ns, "sib/scan", "Current 2 3")

	exception := func(namespace, name, intent, workloads string, expires time.Time) string {
		return fmt.Sprintf(`
apiVersion: security.quartermaster.dev/v1alpha1
kind: SecurityIntentException
metadata: {name: %s, namespace: %s}
spec:
  intent: %s
  workloads: %s
  owner: team-payments
  reason: the vendor's agent needs privileged until its v2 ships (TICKET-1234)
  expires: %s
`, name, namespace, intent, workloads, expires.UTC().Format(time.RFC3339))
	}
	stateOf := func(namespace, name string) string {
		out, _ := cluster.Kubectl(ctx, "get", "sie", name, "-n", namespace, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].reason} {.status.conditions[?(@.type=="Stalled")].status} {.status.exempted}`)
		return strings.Join(strings.Fields(out), " ")
	}
	message := func(namespace, name string) string {
		return kubectlOK(t, "get", "sie", name, "-n", namespace, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
	}
	waitState := func(t *testing.T, namespace, name, want string) {
		t.Helper()
		testenv.PollFor(t, fmt.Sprintf("exception %s/%s to be %q", namespace, name, want), 200*time.Millisecond, engineScan, func() (bool, string) {
			last := stateOf(namespace, name)
			if last == want {
				return true, last
			}
			out, _ := cluster.Kubectl(ctx, "get", "sie", name, "-n", namespace, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
			return false, fmt.Sprintf("it is %q (%s); Kyverno's reports in %s: %s", last, out, ns, policyReportResults(ctx, ns))
		})
	}
	policyException := func(namespace, name string) (*unstructured.Unstructured, error) {
		pe := object("kyverno.io/v2", "PolicyException", kyverno.ExceptionNamespace, intent.PolicyExceptionName(namespace, name))
		return pe, admin.Get(ctx, client.ObjectKeyFromObject(pe), pe)
	}
	in := func(d time.Duration) time.Time { return time.Now().Add(d) }

	t.Run("the API server refuses an exception without an expiry, an owner or a reason", func(t *testing.T) {
		for _, tc := range []struct{ manifest, want string }{
			{strings.Replace(exception(ns, "bad", escape, "{selector: {}}", in(time.Hour)), "  expires:", "  #", 1), "spec.expires: Required value"},
			{strings.Replace(exception(ns, "bad", escape, "{selector: {}}", in(time.Hour)), "  owner: team-payments\n", "", 1), "spec.owner: Required value"},
			{strings.Replace(exception(ns, "bad", escape, "{selector: {}}", in(time.Hour)), "the vendor's agent needs privileged until its v2 ships (TICKET-1234)", "legacy", 1), "spec.reason"},
			{exception(ns, "bad", escape, `{selector: {}, namespaces: ["*", other]}`, in(time.Hour)), `"*" in workloads.namespaces must be its only entry`},
		} {
			out, err := kubectlApplyErr(t, ns, tc.manifest)
			if err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("applying an invalid exception: %v\n%s\nwant the API server's refusal with %q", err, out, tc.want)
			}
		}
	})

	t.Run("the controller refuses what the API server cannot check, naming the check, and writes nothing", func(t *testing.T) {
		for _, tc := range []struct {
			namespace, name, intent, workloads string
			expires                            time.Time
			reason, says                       string
		}{
			{ns, "past", escape, "{selector: {matchLabels: {legacy: 'true'}}}", in(-time.Minute), "Expired", "expired at"},
			{ns, "too-long", escape, "{selector: {matchLabels: {legacy: 'true'}}}", in(72 * time.Hour), "ExpiryBeyondMaximum", "--intents-exception-max-ttl"},
			{ns, "other-ns", escape, "{selector: {}, namespaces: [" + adminNS + "]}", in(time.Hour * 2), "NamespaceNotAllowed", "--intents-exception-admin-namespaces"},
			{adminNS, "everything", escape, `{selector: {}, namespaces: ["*"]}`, in(time.Hour * 2), "ExemptsEverything", "--intents-exception-allow-everything"},
			{ns, "no-intent", "qm-exc-missing", "{selector: {}}", in(time.Hour * 2), "IntentNotFound", "does not exist"},
			{ns, "kubearmor", dns, "{selector: {}}", in(time.Hour * 2), "NoEngineException", "no exception of its own"},
		} {
			kubectlApply(t, tc.namespace, exception(tc.namespace, tc.name, tc.intent, tc.workloads, tc.expires))
			waitState(t, tc.namespace, tc.name, tc.reason+" True")
			if msg := message(tc.namespace, tc.name); !strings.Contains(msg, tc.says) {
				t.Errorf("exception %s: message %q does not name the check (%q)", tc.name, msg, tc.says)
			}
			if _, err := policyException(tc.namespace, tc.name); !apierrors.IsNotFound(err) {
				t.Errorf("exception %s was refused, but its PolicyException: %v", tc.name, err)
			}
		}
	})

	t.Run("an exception becomes Kyverno's PolicyException, and Kyverno skips the exempted workload", func(t *testing.T) {
		kubectlApply(t, ns, exception(ns, "legacy", escape, "{selector: {matchLabels: {legacy: 'true'}}}", in(3*time.Hour)))
		// Kyverno's background scan reports viol-legacy skipped under the PolicyException: one
		// exempted, one violation left of three scanned.
		waitState(t, ns, "legacy", "Exempting 1")
		waitImpact(t, ns, "sib/scan", "Current 1 3")
		pe, err := policyException(ns, "legacy")
		must(t, err)
		exc, _, _ := unstructured.NestedSlice(pe.Object, "spec", "exceptions")
		if len(exc) != 1 || fmt.Sprint(exc[0]) != fmt.Sprintf("map[policyName:%s/%s ruleNames:[*]]", ns, policy) {
			t.Errorf("PolicyException's exceptions: %v; want the binding's Policy %s/%s, every rule", exc, ns, policy)
		}
		if got := kubectlOK(t, "get", "si", escape, "-o", `jsonpath={.status.exceptions[?(@.name=="`+ns+`/legacy")]['name','owner','state','exempted']}`); strings.TrimSpace(got) != ns+"/legacy team-payments Exempting 1" {
			t.Errorf("the intent's status.exceptions: %q", got)
		}
	})

	t.Run("at Block, Kyverno admits an exempted privileged Pod and refuses another", func(t *testing.T) {
		kubectlOK(t, "patch", "si", escape, "--type=merge", "-p", `{"spec":{"intent":{"action":"Block"}}}`)
		eventually(t, "Kyverno's Policy to enforce", func() bool {
			p := object("kyverno.io/v1", "Policy", ns, policy)
			if admin.Get(ctx, client.ObjectKeyFromObject(p), p) != nil {
				return false
			}
			rules, _, _ := unstructured.NestedSlice(p.Object, "spec", "rules")
			if len(rules) == 0 {
				return false
			}
			action, _, _ := unstructured.NestedString(rules[0].(map[string]any), "validate", "failureAction")
			return action == "Enforce"
		})
		k.WaitPolicyReady(t, ns, policy)
		p := privilegedPod(ns, "new-plain", "scan")
		err := admin.Create(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "blocked due to the following policies") {
			t.Fatalf("a privileged app=scan Pod at Block: %v; want Kyverno's refusal", err)
		}
		p = privilegedPod(ns, "new-legacy", "scan")
		p.Labels["legacy"] = "true"
		if err := admin.Create(ctx, p); err != nil {
			t.Fatalf("an exempted privileged Pod at Block: %v; want Kyverno to admit it under the PolicyException", err)
		}
		must(t, admin.Delete(ctx, p))
		kubectlOK(t, "patch", "si", escape, "--type=merge", "-p", `{"spec":{"intent":{"action":"Audit"}}}`)
	})

	t.Run("an exception from a namespace the platform names may exempt another namespace", func(t *testing.T) {
		// Every app=scan workload of ns, compliant or not: Kyverno skips all three under it.
		kubectlApply(t, adminNS, exception(adminNS, "for-scan", escape, "{selector: {matchLabels: {app: scan}}, namespaces: ["+ns+"]}", in(3*time.Hour)))
		waitState(t, adminNS, "for-scan", "Exempting 3")
		waitImpact(t, ns, "sib/scan", "Current 0 3")
		kubectlOK(t, "delete", "sie", "for-scan", "-n", adminNS)
		eventually(t, "the deleted exception's PolicyException to go", func() bool {
			_, err := policyException(adminNS, "for-scan")
			return apierrors.IsNotFound(err)
		})
		waitImpact(t, ns, "sib/scan", "Current 1 3")
	})

	t.Run("at its expiry the PolicyException is deleted and the workload violates again", func(t *testing.T) {
		kubectlOK(t, "patch", "sie", "legacy", "-n", ns, "--type=merge", "-p",
			fmt.Sprintf(`{"spec":{"expires":%q}}`, in(15*time.Second).UTC().Format(time.RFC3339)))
		waitState(t, ns, "legacy", "ExpiresSoon 1")
		waitState(t, ns, "legacy", "Expired True")
		if _, err := policyException(ns, "legacy"); !apierrors.IsNotFound(err) {
			t.Errorf("the expired exception's PolicyException: %v; want it deleted", err)
		}
		waitImpact(t, ns, "sib/scan", "Current 2 3")
		events := &corev1.EventList{}
		must(t, admin.List(ctx, events, client.InNamespace(ns)))
		seen := map[string]bool{}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "legacy" && e.Type == corev1.EventTypeWarning {
				seen[e.Reason] = true
				if e.Reason == "Expired" && !strings.Contains(e.Message, "team-payments") {
					t.Errorf("the Expired Event does not name the owner: %s", e.Message)
				}
			}
		}
		if !seen["ExpiresSoon"] || !seen["Expired"] {
			t.Errorf("Warning Events of the exception: %v; want ExpiresSoon and Expired", seen)
		}
	})
	mgr.stop(t)
}
