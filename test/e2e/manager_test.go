//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const managerNamespace = "quartermaster-system"

// process is the quartermaster binary (the manager or one of its subcommands) running against the
// local cluster, authenticated as a ServiceAccount.
type process struct {
	name    string
	cmd     *exec.Cmd
	logs    *testenv.LogBuffer
	done    chan error
	stopped bool
	// olderRBACSince is when a rollback put this process (a newer build) under the earlier
	// release's RBAC: from then until its pod goes, it may be denied what only its own release
	// grants (a rollout's ordinary overlap, the manager says so and goes on).
	olderRBACSince time.Time
}

// startManager runs the manager authenticated as its own ServiceAccount (bound to the generated
// ClusterRole by config/local), never as admin.
func startManager(t *testing.T, args ...string) *process {
	t.Helper()
	return startAs(t, "manager", managerNamespace, "quartermaster-manager", nil, args...)
}

// startAs runs the quartermaster binary with args as the ServiceAccount namespace/serviceAccount,
// with env added to the test's environment (processEnv); it is stopped when the test ends.
func startAs(t *testing.T, name, namespace, serviceAccount string, env []string, args ...string) *process {
	t.Helper()
	return startBinaryAs(t, managerBin, name, namespace, serviceAccount, env, args...)
}

// startBinaryAs is startAs for another build of the quartermaster binary (an earlier release's).
func startBinaryAs(t *testing.T, bin, name, namespace, serviceAccount string, env []string, args ...string) *process {
	t.Helper()
	kubeconfig, _, err := cluster.ServiceAccountKubeconfig(context.Background(), namespace, serviceAccount, time.Hour)
	must(t, err)
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	must(t, os.WriteFile(path, kubeconfig, 0o600))

	p := &process{name: name, logs: &testenv.LogBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(processEnv("KUBECONFIG="+path), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	must(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.stop(t)
		// Every process in these tests runs under its generated or shipped RBAC: a denial is a
		// missing rule.
		denials, overlap := forbidden(p.logs.String(), p.olderRBACSince)
		if len(denials) > 0 {
			t.Errorf("the %s hit an RBAC denial under its roles:\n%s", name, strings.Join(denials, "\n"))
		}
		if len(overlap) > 0 {
			t.Logf("the %s, under the earlier release's RBAC after a rollback began, was denied (expected):\n%s", name, strings.Join(overlap, "\n"))
		}
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.logs)
		}
	})
	return p
}

// processEnv is the environment of a process the tests start: the test's own without the AWS
// SDK's settings (a test that runs an AWS client gives its process its own), and extra.
func processEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "AWS_") })
	return append(env, extra...)
}

// forbidden returns the log lines that report a Forbidden answer, except the API server's refusal
// to create objects (Events, mostly) in a namespace that is being deleted: that is namespace
// lifecycle, not RBAC. Lines logged at or after olderRBACSince (when it is set) are returned apart,
// as overlap: a newer manager still running while a rollback has installed the earlier release's
// roles.
func forbidden(logs string, olderRBACSince time.Time) (denials, overlap []string) {
	for line := range strings.Lines(logs) {
		if !strings.Contains(strings.ToLower(line), "forbidden") || strings.Contains(line, "because it is being terminated") {
			continue
		}
		var entry struct {
			TS time.Time `json:"ts"`
		}
		if !olderRBACSince.IsZero() && json.Unmarshal([]byte(line), &entry) == nil && !entry.TS.Before(olderRBACSince.Truncate(time.Second)) {
			overlap = append(overlap, strings.TrimSpace(line))
			continue
		}
		denials = append(denials, strings.TrimSpace(line))
	}
	return denials, overlap
}

// stop sends SIGTERM and waits for a clean exit, once.
func (p *process) stop(t *testing.T) {
	t.Helper()
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, err)
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("%s did not stop within 30s of SIGTERM", p.name)
	}
}

// kill sends SIGKILL (a crash) and returns how the process ended.
func (p *process) kill(t *testing.T) error {
	t.Helper()
	p.stopped = true
	must(t, p.cmd.Process.Signal(syscall.SIGKILL))
	return <-p.done
}

// restConfigAs is a client configuration authenticated as the ServiceAccount namespace/name.
func restConfigAs(ctx context.Context, namespace, name string) (*rest.Config, error) {
	kubeconfig, _, err := cluster.ServiceAccountKubeconfig(ctx, namespace, name, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	return clientcmd.RESTConfigFromKubeConfig(kubeconfig)
}

// clientsetAs is a clientset authenticated as the ServiceAccount namespace/name.
func clientsetAs(ctx context.Context, namespace, name string) (*kubernetes.Clientset, error) {
	cfg, err := restConfigAs(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().String()
}

// TestManagerRunsUnderItsGeneratedRBAC runs the manager as configured by default: every controller
// that is configured (namespaces on namespace-requests, which no other parallel test serves,
// mirrors and intents).
func TestManagerRunsUnderItsGeneratedRBAC(t *testing.T) {
	parallel(t, mirrorsController, intentsController)
	ctx := context.Background()
	metricsAddr, probeAddr := freeAddr(t), freeAddr(t)
	leaseName := "qm-e2e-" + fmt.Sprint(time.Now().UnixNano())
	mgr := startManager(t,
		"--leader-elect", "--leader-election-namespace="+managerNamespace, "--leader-election-id="+leaseName,
		"--metrics-bind-address="+metricsAddr, "--health-probe-bind-address="+probeAddr)

	lease := &coordinationv1.Lease{}
	eventually(t, "the manager to hold the leader Lease", func() bool {
		err := admin.Get(ctx, client.ObjectKey{Namespace: managerNamespace, Name: leaseName}, lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	})

	for _, path := range []string{"/healthz", "/readyz"} {
		eventually(t, path+" to answer 200", func() bool {
			resp, err := http.Get("http://" + probeAddr + path)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}

	// Metrics: HTTPS, and only callers the API server authorizes for GET /metrics.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's self-signed serving cert
	scrape := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, "https://"+metricsAddr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := insecure.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	eventually(t, "the metrics endpoint to reject an unauthenticated request with 401", func() bool {
		return scrape("") == http.StatusUnauthorized
	})
	ns := newNamespace(t)
	for _, sa := range []string{"scraper", "stranger"} {
		must(t, admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}))
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "quartermaster-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}},
	}
	must(t, admin.Create(ctx, binding))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), binding) })
	_, strangerToken, err := cluster.ServiceAccountKubeconfig(ctx, ns, "stranger", 10*time.Minute)
	must(t, err)
	_, scraperToken, err := cluster.ServiceAccountKubeconfig(ctx, ns, "scraper", 10*time.Minute)
	must(t, err)
	if code := scrape(strangerToken); code != http.StatusForbidden {
		t.Errorf("a token without the metrics-reader role got %d, want 403", code)
	}
	eventually(t, "the metrics-reader token to be allowed", func() bool { return scrape(scraperToken) == http.StatusOK })

	// Shutting down releases the Lease so a successor need not wait for it to expire.
	mgr.stop(t)
	must(t, admin.Get(ctx, client.ObjectKeyFromObject(lease), lease))
	if lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "" {
		t.Errorf("the Lease is still held by %q after shutdown", *lease.Spec.HolderIdentity)
	}
}

func TestManagerRejectsUnknownControllers(t *testing.T) {
	parallel(t)
	out, err := exec.Command(managerBin, "--controllers=nonsense").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("want a non-zero exit, got %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `unknown controller "nonsense"`) || !strings.Contains(string(out), "valid controllers are") {
		t.Errorf("the error does not name the valid controllers:\n%s", out)
	}
}
