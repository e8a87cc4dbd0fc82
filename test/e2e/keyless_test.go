//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsv1alpha1 "github.com/quartermaster-dev/quartermaster/api/namespaces/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/oidcissuer"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestKeylessPipelineStepWithOnlyItsToken: a pipeline step that holds nothing but its job's OIDC
// identity token (no kubeconfig, no Kubernetes credential of any kind) runs `quartermaster request`
// against the exchange of a manager running under its generated RBAC, gets the kubeconfig of the
// namespace its claims name, uses it there and nowhere else, and cannot use the token twice.
func TestKeylessPipelineStepWithOnlyItsToken(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	requests := newRequestsNamespace(t)
	gh := oidcissuer.Start(t, "/github")
	dir := t.TempDir()
	issuerCA := filepath.Join(dir, "issuer-ca.pem")
	must(t, os.WriteFile(issuerCA, gh.CertPEM(), 0o600))
	certDir := filepath.Join(dir, "exchange-tls")
	must(t, os.Mkdir(certDir, 0o700))
	testenv.ServingCert(t, certDir)
	addr, probeAddr := freeAddr(t), freeAddr(t)
	// The manager trusts the loopback issuer's certificate as it would a public CA's.
	mgr := startAs(t, "manager", managerNamespace, "quartermaster-manager", []string{"SSL_CERT_FILE=" + issuerCA},
		"--controllers=namespaces", "--health-probe-bind-address="+probeAddr, "--exchange-bind-address="+addr, "--exchange-cert-dir="+certDir,
		"--requests-namespace="+requests)
	// As a Service would: the step is sent to the manager once its readiness (which includes the
	// exchange listening) says so.
	eventually(t, "the manager's /readyz to answer 200", func() bool {
		resp, err := http.Get("http://" + probeAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	c, err := client.New(cluster.Config, client.Options{Scheme: manager.Scheme(nsv1alpha1.AddToScheme)})
	must(t, err)
	const aud = "https://quartermaster.e2e"
	ti := &nsv1alpha1.TrustedIssuer{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-github"},
		Spec: nsv1alpha1.TrustedIssuerSpec{
			IssuerURL: gh.URL, Audience: aud, IdentityClaim: "repository",
			Rules: []nsv1alpha1.IssuerRule{{Name: "prs", Claims: map[string][]string{"repository": {"acme/*"}, "event_name": {"pull_request"}},
				Namespace: "e2e-{repository|last}-pr-{ref|pull}", TTL: &metav1.Duration{Duration: time.Hour}}},
		},
	}
	must(t, c.Create(ctx, ti))
	leaveNamespaces(t, "e2e-web-pr-7")
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), ti)
		_ = admin.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requests, Name: "e2e-web-pr-7"}})
	})

	token := gh.Token(t, oidcissuer.GitHubClaims(aud, "acme/web", "refs/pull/7/merge", "pull_request"))
	step := func() (int, string) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, managerBin, "request", "--exchange-url", "https://"+addr, "--id-token-env", "QM_ID_TOKEN",
			"--exchange-ca-file", filepath.Join(certDir, "tls.crt"), "--kubeconfig-out", filepath.Join(dir, "kubeconfig"))
		// Nothing of the test's environment: no KUBECONFIG, no HOME with a ~/.kube.
		cmd.Env = []string{"QM_ID_TOKEN=" + token, "PATH=/usr/bin:/bin", "HOME=" + dir}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), string(out)
		}
		must(t, err)
		return 0, string(out)
	}
	code, out := step()
	if code != 0 || !strings.Contains(out, "namespace e2e-web-pr-7 is ready") {
		t.Fatalf("the pipeline step: exit %d\n%s\nmanager logs:\n%s", code, out, mgr.logs.Tail(40))
	}
	kubeconfig, err := os.ReadFile(filepath.Join(dir, "kubeconfig"))
	must(t, err)
	works(t, kubeconfig, "e2e-web-pr-7")
	if strings.Contains(mgr.logs.String(), token) {
		t.Error("the manager logged the token")
	}

	// The same token again (a stolen copy): refused, exit 2, the check named.
	code, out = step()
	if code != 2 || !strings.Contains(out, "replay") || strings.Contains(out, token) {
		t.Errorf("the token's second use: exit %d\n%s", code, out)
	}
}
