//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestIntentImpactFromKyvernoReports proves that an intent's and a binding's status show what the
// real Kyverno 1.19.1's background scans found among the workloads that already run — read from
// the PolicyReports its reports controller wrote, never from a report of ours — kept current as
// workloads come and go, the union over a namespaced and a cluster binding, a policy of the
// user's own in the same reports passed over, an intent no engine scans said to be NotScanned,
// and Unknown (not zero) while Kyverno's reports controller is down.
func TestIntentImpactFromKyvernoReports(t *testing.T) {
	parallel(t, intentsController, kyvernoEngine)
	ctx := context.Background()
	installKubeArmorCRD(t) // escapeToHost and dnsManipulation are KubeArmor's too: with it, they are in force
	k := kyverno.Start(t, cluster.Config, kyverno.OnlyLabelledNamespaces())
	mgr := startManager(t, "--controllers=intents", "--health-probe-bind-address=0")
	ns := newKyvernoNamespace(t)

	const (
		auditIntent = "qm-impact-escape-audit"
		dnsIntent   = "qm-impact-dns"
		ownPolicy   = "qm-impact-users-own"
	)
	for _, name := range []string{auditIntent, dnsIntent} {
		t.Cleanup(func() {
			_, _ = cluster.Kubectl(context.Background(), "delete", "securityintent", name, "--ignore-not-found", "--wait=false")
		})
	}
	t.Cleanup(func() {
		_, _ = cluster.Kubectl(context.Background(), "delete", "csib", "qm-impact-cluster", "--ignore-not-found", "--wait=false")
		_, _ = cluster.Kubectl(context.Background(), "delete", "clusterpolicy", ownPolicy, "--ignore-not-found", "--wait=false")
	})

	// Workloads that run before the intent exists: three privileged app=scan Pods (they break the
	// baseline standard), two compliant ones, and a privileged Pod the binding does not select.
	for _, name := range []string{"viol-1", "viol-2", "viol-3"} {
		must(t, admin.Create(ctx, privilegedPod(ns, name, "scan")))
	}
	for _, name := range []string{"ok-1", "ok-2"} {
		must(t, admin.Create(ctx, compliantPod(ns, name, "scan")))
	}
	must(t, admin.Create(ctx, privilegedPod(ns, "other-1", "other")))
	// A policy of the user's own, failing every privileged Pod of the namespace: its results are
	// in the same PolicyReports and must not count.
	kubectlApply(t, "", `
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: `+ownPolicy+`}
spec:
  background: true
  rules:
  - name: no-privileged
    match: {any: [{resources: {kinds: [Pod], namespaces: [`+ns+`]}}]}
    validate:
      failureAction: Audit
      message: privileged is not allowed here
      pattern: {spec: {containers: [{"=(securityContext)": {"=(privileged)": "false"}}]}}
`)

	kubectlApply(t, ns, `
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: `+auditIntent+`}
spec: {intent: {id: escapeToHost, action: Audit}}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntentBinding
metadata: {name: scan}
spec:
  intents: [{name: `+auditIntent+`}]
  selector: {workloadSelector: {matchLabels: {app: scan}}}
`)
	const policy = "scan-escapetohost"

	t.Run("an Audit intent shows the existing workloads that violate it, with Kyverno's message", func(t *testing.T) {
		waitImpact(t, ns, "sib/scan", "Current 3 5")
		waitImpact(t, "", "si/"+auditIntent, "Current 3 5")
		imp := readImpact(t, "", "si/"+auditIntent)
		var names []string
		for _, w := range imp.Violating {
			names = append(names, w.Namespace+"/"+w.Kind+"/"+w.Name)
			if w.Policy != "KyvernoPolicy/"+policy || !strings.Contains(w.Message, `It violates PodSecurity "baseline:latest"`) {
				t.Errorf("violating %s: policy %q, message %q; want KyvernoPolicy/%s and Kyverno's own PodSecurity message", w.Name, w.Policy, w.Message, policy)
			}
		}
		if want := []string{ns + "/Pod/viol-1", ns + "/Pod/viol-2", ns + "/Pod/viol-3"}; strings.Join(names, ",") != strings.Join(want, ",") {
			t.Errorf("violating %v, want %v", names, want)
		}
		if !strings.Contains(imp.Message, "KyvernoPolicy/"+policy) {
			t.Errorf("impact message %q does not name the policy", imp.Message)
		}
		// What the reports say for the user's own policy was passed over, yet Kyverno did report it.
		viol1 := &corev1.Pod{}
		must(t, admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: "viol-1"}, viol1))
		eventually(t, "Kyverno's PolicyReport of viol-1 failing "+ownPolicy, func() bool { return policyReportFails(ctx, ns, viol1.UID, ownPolicy) })
		out := kubectlOK(t, "get", "si/"+auditIntent)
		if header := strings.Fields(strings.SplitN(out, "\n", 2)[0]); !slices.Contains(header, "VIOLATIONS") {
			t.Errorf("kubectl get si shows no VIOLATIONS column:\n%s", out)
		}
	})

	t.Run("kept current: a violating workload goes, another comes", func(t *testing.T) {
		must(t, admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "viol-3"}}, client.GracePeriodSeconds(0)))
		waitImpact(t, "", "si/"+auditIntent, "Current 2 4")
		must(t, admin.Create(ctx, privilegedPod(ns, "viol-4", "scan")))
		waitImpact(t, "", "si/"+auditIntent, "Current 3 5")
		waitImpact(t, ns, "sib/scan", "Current 3 5")
	})

	t.Run("a cluster binding's ClusterPolicy: its own impact, and the intent's is the union", func(t *testing.T) {
		kubectlApply(t, "", `
apiVersion: intent.security.nimbus.com/v1alpha1
kind: ClusterSecurityIntentBinding
metadata: {name: qm-impact-cluster}
spec:
  intents: [{name: `+auditIntent+`}]
  selector: {nsSelector: {matchNames: [`+ns+`]}}
`)
		// Every Pod of the namespace: viol-1, viol-2, viol-4 and other-1 break the standard.
		waitImpact(t, "", "csib/qm-impact-cluster", "Current 4 6")
		waitImpact(t, "", "si/"+auditIntent, "Current 4 6")
	})

	t.Run("an intent no engine scans says so", func(t *testing.T) {
		kubectlApply(t, ns, `
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: `+dnsIntent+`}
spec: {intent: {id: dnsManipulation, action: Block}}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntentBinding
metadata: {name: dns}
spec:
  intents: [{name: `+dnsIntent+`}]
  selector: {workloadSelector: {matchLabels: {app: scan}}}
`)
		waitImpact(t, "", "si/"+dnsIntent, "NotScanned")
		waitImpact(t, ns, "sib/dns", "NotScanned")
		if imp := readImpact(t, ns, "sib/dns"); !strings.Contains(imp.Message, "dnsManipulation (KubeArmor, NetworkPolicy)") {
			t.Errorf("sib/dns impact message %q does not name the intent and its engines", imp.Message)
		}
	})

	t.Run("Kyverno's reports controller down: Unknown, not zero; back: Current again", func(t *testing.T) {
		k.KillReports(t)
		waitImpact(t, "", "si/"+auditIntent, "Unknown")
		imp := readImpact(t, "", "si/"+auditIntent)
		if imp.Violations != nil || !strings.Contains(imp.Message, "reports controller is not running") || !strings.Contains(imp.Message, kyverno.Namespace+"/"+kyverno.ReportsLease) {
			t.Errorf("impact while the reports controller is down: %+v; want no count and a message naming its Lease", imp)
		}
		waitImpact(t, ns, "sib/scan", "Unknown")
		k.StartReports(t)
		waitImpact(t, "", "si/"+auditIntent, "Current 4 6")
		waitImpact(t, ns, "sib/scan", "Current 3 5")
	})

	promote := func(t *testing.T, args ...string) (int, string) {
		t.Helper()
		out, err := exec.Command(managerBin, append([]string{"promote", "--kubeconfig", cluster.Kubeconfig, "--timeout", "3m"}, args...)...).CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return 0, string(out)
		case errors.As(err, &exit):
			return exit.ExitCode(), string(out)
		}
		t.Fatalf("quartermaster promote: %v\n%s", err, out)
		return 0, ""
	}

	t.Run("promotion is refused while workloads violate the intent, listing them", func(t *testing.T) {
		code, out := promote(t, auditIntent)
		if code != 2 || !strings.Contains(out, "not promoted") || !regexp.MustCompile(`(?m)^NAMESPACE +KIND +NAME +POLICY +MESSAGE$`).MatchString(out) ||
			!strings.Contains(out, "viol-1") || !strings.Contains(out, "other-1") {
			t.Fatalf("promote with 4 violations: exit %d, output:\n%s\nwant exit 2 and the violating workloads listed", code, out)
		}
		if action := kubectlOK(t, "get", "si/"+auditIntent, "-o", "jsonpath={.spec.intent.action}"); testenv.LastLine([]byte(action)) != "Audit" {
			t.Errorf("the refused promotion changed the action to %q", action)
		}
	})

	t.Run("once nothing violates it, promotion switches to Block and waits until Kyverno enforces it", func(t *testing.T) {
		for _, name := range []string{"viol-1", "viol-2", "viol-4", "other-1"} {
			must(t, admin.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.GracePeriodSeconds(0)))
		}
		waitImpact(t, "", "si/"+auditIntent, "Current 0 2")
		code, out := promote(t, "--dry-run", auditIntent)
		if code != 0 || !strings.Contains(out, "would be promoted") {
			t.Fatalf("promote --dry-run: exit %d, output:\n%s", code, out)
		}
		code, out = promote(t, auditIntent)
		if code != 0 || !strings.Contains(out, "promoted (Audit → Block)") || !strings.Contains(out, "Block is in force") {
			t.Fatalf("promote with no violation: exit %d, output:\n%s", code, out)
		}
		err := admin.Create(ctx, privilegedPod(ns, "viol-5", "scan"))
		if err == nil || !strings.Contains(err.Error(), "blocked due to the following policies") || !strings.Contains(err.Error(), policy) {
			t.Fatalf("a privileged app=scan Pod after promotion: %v; want Kyverno's refusal naming %s", err, policy)
		}
		if code, out := promote(t, auditIntent); code != 0 || !strings.Contains(out, "already Block") {
			t.Errorf("promoting again: exit %d, output:\n%s", code, out)
		}
	})

	t.Run("an intent whose impact cannot be known is promoted only with --force", func(t *testing.T) {
		kubectlOK(t, "patch", "si/"+dnsIntent, "--type=merge", "-p", `{"spec":{"intent":{"action":"Audit"}}}`)
		// Audit is in force once its binding has put the new generation in force.
		eventually(t, "the intent Ready at its new generation", func() bool {
			out, err := cluster.Kubectl(ctx, "get", "si/"+dnsIntent, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].observedGeneration} {.metadata.generation}`)
			f := strings.Fields(testenv.LastLine([]byte(out)))
			return err == nil && len(f) == 3 && f[0] == "True" && f[1] == f[2]
		})
		code, out := promote(t, dnsIntent)
		if code != 2 || !strings.Contains(out, "NotScanned") {
			t.Fatalf("promote of a NotScanned intent: exit %d, output:\n%s", code, out)
		}
		if code, out := promote(t, "--force", dnsIntent); code != 0 || !strings.Contains(out, "promoted") {
			t.Fatalf("promote --force: exit %d, output:\n%s", code, out)
		}
	})

	mgr.stop(t)
}

// compliantPod is a Pod the baseline and restricted standards' privileged check admits.
func compliantPod(ns, name, app string) *corev1.Pod {
	p := privilegedPod(ns, name, app)
	p.Spec.Containers[0].SecurityContext = nil
	return p
}

// impactLine is "STATE VIOLATIONS SCANNED" of an object's status.impact ("STATE" alone when it
// has no counts).
func impactLine(ns, obj string) string {
	args := []string{"get", obj, "-o", "jsonpath={.status.impact.state} {.status.impact.violations} {.status.impact.scanned}"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	out, err := cluster.Kubectl(context.Background(), args...)
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(testenv.LastLine([]byte(out))), " ")
}

// engineScan bounds a wait for what Kyverno's background scans report (an impact, a workload
// exempted): its reports controller, rescanning every workload a policy or exception names, is
// slowest of all on a busy machine.
const engineScan = 5 * time.Minute

// waitImpact waits until obj's impactLine is want.
func waitImpact(t *testing.T, ns, obj, want string) {
	t.Helper()
	testenv.PollFor(t, fmt.Sprintf("%s's impact to be %q", obj, want), 200*time.Millisecond, engineScan, func() (bool, string) {
		last := impactLine(ns, obj)
		return last == want, fmt.Sprintf("it is %q", last)
	})
}

func readImpact(t *testing.T, ns, obj string) intentv1alpha1.Impact {
	t.Helper()
	args := []string{"get", obj, "-o", "jsonpath={.status.impact}"}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	var imp intentv1alpha1.Impact
	must(t, json.Unmarshal([]byte(testenv.LastLine([]byte(kubectlOK(t, args...)))), &imp))
	return imp
}
