//go:build e2e

package e2e

import (
	"context"

	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/enginecrds"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestSecurityIntentsOnTheLocalCluster installs KubeArmor's CRD and runs a real Kyverno (its CRDs
// and both controllers, through the harness), runs the manager (as its ServiceAccount) with the
// intents controller, applies the samples, and follows the generated policies through real
// garbage collection. The bindings are Ready only once Kyverno has put their policies in force.
func TestSecurityIntentsOnTheLocalCluster(t *testing.T) {
	parallel(t, intentsController, kyvernoEngine)
	ctx := context.Background()
	installKubeArmorCRD(t)
	granted := grantKyvernoBackground(t)
	kyverno.Start(t, cluster.Config, kyverno.OnlyLabelledNamespaces())
	granted()
	mgr := startManager(t, "--controllers=intents", "--health-probe-bind-address=0")

	ns := newKyvernoNamespace(t)
	t.Run("the manager's Kyverno policies are only the catalogue's", func(t *testing.T) { testManagerKyvernoPolicies(t, ns) })
	samples := filepath.Join(testenv.RepoRoot(), "config", "samples", "intents")
	for _, f := range []string{"escape-to-host.yaml", "multiple-intents.yaml"} {
		kubectlOK(t, "apply", "-n", ns, "-f", filepath.Join(samples, f))
	}
	waitIntents := func(kind string) {
		t.Helper()
		if out, err := cluster.Kubectl(ctx, "wait", "-n", ns, kind, "--all", "--for=condition=Ready", "--timeout=120s"); err != nil {
			objects, _ := cluster.Kubectl(ctx, "get", "-n", ns, kind, "-o", "yaml")
			t.Fatalf("%s: %v\n%s\nmanager logs:\n%s", out, err, objects, mgr.logs.String())
		}
	}
	waitIntents("sib")
	waitIntents("np")

	t.Run("kubectl shows what Nimbus shows", func(t *testing.T) {
		out := kubectlOK(t, "get", "-n", ns, "sib", "multiple-sis-binding")
		for _, col := range []string{"STATUS", "INTENTS", "NIMBUSPOLICY", "Created", "3", "multiple-sis-binding"} {
			if !strings.Contains(out, col) {
				t.Errorf("kubectl get sib lacks %q:\n%s", col, out)
			}
		}
		out = kubectlOK(t, "get", "-n", ns, "np", "escape-to-host-binding", "-o", "jsonpath={.status.adapterPolicies}")
		for _, p := range []string{"KubeArmorPolicy/escape-to-host-binding-escapetohost-disallowchroot", "KyvernoPolicy/escape-to-host-binding-escapetohost"} {
			if !strings.Contains(out, p) {
				t.Errorf("adapterPolicies %s lack %s", out, p)
			}
		}
		out = kubectlOK(t, "get", "-n", ns, "kubearmorpolicies", "-o", "name")
		if n := strings.Count(out, "\n"); n != 3+3 {
			t.Errorf("%d KubeArmorPolicies, want 3 for escapeToHost and 3 for the three intents:\n%s", n, out)
		}
		level := kubectlOK(t, "get", "-n", ns, "policies.kyverno.io", "escape-to-host-binding-escapetohost",
			"-o", "jsonpath={.spec.rules[0].validate.podSecurity.level} {.spec.rules[0].validate.failureAction}")
		// The last line: kubectl prints Kyverno 1.19's deprecation warning for kyverno.io/v1 first.
		if level = testenv.LastLine([]byte(level)); level != "restricted Enforce" {
			t.Errorf("Kyverno Policy level and action %q, want restricted Enforce", level)
		}
	})

	t.Run("deleting a binding deletes its policies (garbage collection)", func(t *testing.T) {
		kubectlOK(t, "delete", "-n", ns, "sib", "escape-to-host-binding", "--wait=true")
		eventually(t, "the escapeToHost policies to be collected", func() bool {
			out, err := cluster.Kubectl(ctx, "get", "-n", ns, "kubearmorpolicies,policies.kyverno.io,nimbuspolicies", "-o", "name")
			return err == nil && !strings.Contains(out, "escapetohost") && !strings.Contains(out, "nimbuspolicy.intent.security.nimbus.com/escape-to-host-binding")
		})
	})
	t.Run("assessTLS once nimbus-k8tls is installed, its scans narrowed by the admission policy", func(t *testing.T) {
		// What nimbus-k8tls's chart installs that the controller looks for, then the optional RBAC.
		kubectlOK(t, "create", "namespace", intent.K8TLSNamespace)
		// Gone before the next test's manager starts: it would find nimbus-k8tls without the Role.
		t.Cleanup(func() { _, _ = cluster.Kubectl(ctx, "delete", "namespace", intent.K8TLSNamespace, "--timeout=120s") })
		kubectlOK(t, "create", "serviceaccount", "-n", intent.K8TLSNamespace, intent.K8TLSServiceAccount)
		kubectlOK(t, "apply", "-k", filepath.Join(testenv.RepoRoot(), "config", "rbac", "intents-k8tls"))
		t.Cleanup(func() {
			_, _ = cluster.Kubectl(ctx, "delete", "-k", filepath.Join(testenv.RepoRoot(), "config", "rbac", "intents-k8tls"), "--ignore-not-found")
		})
		kubectlOK(t, "apply", "-f", filepath.Join(samples, "assess-tls.yaml"))
		t.Cleanup(func() {
			_, _ = cluster.Kubectl(ctx, "delete", "-f", filepath.Join(samples, "assess-tls.yaml"), "--ignore-not-found")
		})
		const cronJob = "tls-assessment-binding-assesstls"
		eventually(t, "the scan's CronJob and its addresses", func() bool {
			out, err := cluster.Kubectl(ctx, "get", "-n", intent.K8TLSNamespace, "cronjob/"+cronJob, "configmap/"+cronJob+"-addresses", "-o", "name")
			return err == nil && strings.Count(out, "\n") == 2
		})
		kubectlOK(t, "wait", "cwnp", "tls-assessment-binding", "--for=condition=Ready", "--timeout=60s")

		// The manager may write CronJobs there now; only the scans it generates get through.
		asManager, err := clientsetAs(ctx, managerNamespace, "quartermaster-manager")
		must(t, err)
		rogue := &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Name: "qm-rogue"},
			Spec: batchv1.CronJobSpec{Schedule: "@daily", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: intent.K8TLSServiceAccount,
					Containers: []corev1.Container{{Name: "x", Image: "busybox", Command: []string{"sh"}}}},
			}}}},
		}
		// Polled: the API server enforces a policy some time after it is created.
		eventually(t, "a CronJob of another image, as the manager, refused by quartermaster-manager-k8tls-scans", func() bool {
			_, err := asManager.BatchV1().CronJobs(intent.K8TLSNamespace).Create(ctx, rogue, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err != nil && strings.Contains(err.Error(), "quartermaster-manager-k8tls-scans")
		})
	})

	mgr.stop(t)
}

const kubeArmorCRD = "kubearmorpolicies.security.kubearmor.com"

// removeKubeArmorCRD deletes KubeArmor's CRD when another test installed it, and waits until it
// is gone: for a test that has the cluster alone (no manager of another test relies on it).
func removeKubeArmorCRD(t *testing.T) {
	t.Helper()
	if out, err := cluster.Kubectl(context.Background(), "delete", "crd", kubeArmorCRD, "--ignore-not-found", "--wait=true", "--timeout=120s"); err != nil {
		t.Fatal(out, err)
	} else if strings.TrimSpace(out) != "" {
		t.Logf("KubeArmor's CRD, installed by an earlier test, removed: %s", strings.TrimSpace(out))
	}
}

// installKubeArmorCRD installs KubeArmor's own CRD (KubeArmor enforces in the kernel and cannot run
// here: its policies are checked against its schema only) and waits until it is served.
func installKubeArmorCRD(t *testing.T) {
	t.Helper()
	kubectlOK(t, "apply", "--server-side", "-f", enginecrds.Dir(t, enginecrds.KubeArmorModule, enginecrds.KubeArmor))
	// Polled rather than kubectl wait: a CRD just created may have no conditions yet, which
	// kubectl wait reports as an error instead of waiting.
	eventually(t, kubeArmorCRD+" Established", func() bool {
		out, err := cluster.Kubectl(context.Background(), "get", "crd", kubeArmorCRD,
			"-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
		return err == nil && out == "True"
	})
}
