//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// pipeline is a pipeline's identity: the ServiceAccount of config/samples/namespaces/
// pipeline-rbac.yaml, with exactly the rights that sample grants, in a requests namespace.
type pipeline struct {
	kubeconfig string // path
	dir        string
	requests   string // the requests namespace
}

// newPipeline applies pipeline-rbac.yaml in the requests namespace requests (the sample's
// namespace-requests replaced) and returns the pipeline once the authorizer lets it create
// requests there.
func newPipeline(t *testing.T, requests string) *pipeline {
	t.Helper()
	ctx := context.Background()
	sample, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "samples", "namespaces", "pipeline-rbac.yaml"))
	must(t, err)
	p := &pipeline{dir: t.TempDir(), requests: requests}
	rbac := filepath.Join(p.dir, "pipeline-rbac.yaml")
	must(t, os.WriteFile(rbac, []byte(strings.ReplaceAll(string(sample), "namespace: "+requestsNamespace, "namespace: "+requests)), 0o600))
	kubectlOK(t, "apply", "-f", rbac)
	waitAllowed(t, "system:serviceaccount:"+requests+":ci-pipeline",
		authorizationv1.ResourceAttributes{Namespace: requests, Verb: "create", Resource: "configmaps"})
	kubeconfig, _, err := cluster.ServiceAccountKubeconfig(ctx, requests, "ci-pipeline", time.Hour)
	must(t, err)
	p.kubeconfig = filepath.Join(p.dir, "pipeline.kubeconfig")
	must(t, os.WriteFile(p.kubeconfig, kubeconfig, 0o600))
	return p
}

// run runs a command as the pipeline, with the locally built kubectl on PATH, and returns its
// exit code, stdout and stderr. The context bounds a hang, not a timing.
func (p *pipeline) run(t *testing.T, name string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+p.kubeconfig, "PATH="+cluster.BinDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"REQUESTS_NAMESPACE="+p.requests) // request.sh's; quartermaster request is given --requests-namespace
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	case err != nil:
		t.Fatalf("running %s: %v", name, err)
	}
	return 0, stdout.String(), stderr.String()
}

// works checks that a kubeconfig grants its namespace and nothing outside it.
func works(t *testing.T, kubeconfig []byte, namespace string) {
	t.Helper()
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	must(t, err)
	cs, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	ctx := context.Background()
	if _, err := cs.CoreV1().ConfigMaps(namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "from-pipeline"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("the handed-out kubeconfig cannot create in %s: %v", namespace, err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err == nil {
		t.Errorf("the handed-out kubeconfig for %s can list ConfigMaps in default", namespace)
	}
}

// TestPipelineRequestsANamespaceWithLeastRights: `quartermaster request` and the kubectl recipe,
// run as a pipeline bound to exactly pipeline-rbac.yaml, get a working kubeconfig, reuse a
// request, and fail at once with the controller's reason when a request is refused.
func TestPipelineRequestsANamespaceWithLeastRights(t *testing.T) {
	parallel(t)
	requests := newRequestsNamespace(t)
	startNamespacesManager(t, requests)
	p := newPipeline(t, requests)
	taken := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-pipe-taken"}}
	must(t, admin.Create(context.Background(), taken))
	t.Cleanup(func() { _ = admin.Delete(context.Background(), taken) })
	leaveNamespaces(t, "e2e-pipe", "e2e-pipe-sh", "kube-pipe")
	for _, name := range []string{"e2e-pipe", "e2e-pipe-sh", "kube-pipe", "e2e-pipe-taken"} {
		t.Cleanup(func() {
			_ = admin.Delete(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requests, Name: name}})
		})
	}

	t.Run("quartermaster request", func(t *testing.T) {
		// Flags after the name (kubectl's convention; the second run has them before it).
		code, _, stderr := p.run(t, managerBin, "request", "e2e-pipe", "--ttl", "1h", "--kubeconfig-out=e2e-pipe.kubeconfig", "--requests-namespace", requests)
		if code != 0 || !strings.Contains(stderr, "namespace e2e-pipe is ready") {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
		kubeconfig, err := os.ReadFile(filepath.Join(p.dir, "e2e-pipe.kubeconfig"))
		must(t, err)
		if info, err := os.Stat(filepath.Join(p.dir, "e2e-pipe.kubeconfig")); err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("kubeconfig file mode: %v %v", info.Mode(), err)
		}
		works(t, kubeconfig, "e2e-pipe")
		cm := &corev1.ConfigMap{}
		must(t, admin.Get(context.Background(), client.ObjectKey{Namespace: requests, Name: "e2e-pipe"}, cm))
		if cm.Data["ttl"] != "1h0m0s" {
			t.Errorf("request data %v, want ttl 1h", cm.Data)
		}

		// Again: the request exists and is reused.
		code, _, stderr = p.run(t, managerBin, "request", "--requests-namespace="+requests, "--kubeconfig-out=again.kubeconfig", "e2e-pipe")
		if code != 0 || !strings.Contains(stderr, "reusing it") {
			t.Errorf("second run: exit %d, stderr:\n%s", code, stderr)
		}
	})

	t.Run("refusals exit 2 at once with the reason", func(t *testing.T) {
		// --timeout is far longer than the test's own bound: an exit with the reason proves the
		// command did not wait for it.
		for name, reason := range map[string]string{"kube-pipe": "Denied", "e2e-pipe-taken": "NamespaceConflict"} {
			code, _, stderr := p.run(t, managerBin, "request", "--timeout=1h", "--requests-namespace="+requests, name)
			if code != 2 || !strings.Contains(stderr, "("+reason+")") {
				t.Errorf("%s: exit %d, want 2 with reason %s; stderr:\n%s", name, code, reason, stderr)
			}
		}
	})

	t.Run("kubectl recipe", func(t *testing.T) {
		recipe := filepath.Join(testenv.RepoRoot(), "config", "samples", "namespaces", "request.sh")
		code, stdout, stderr := p.run(t, "bash", recipe, "e2e-pipe-sh", "30m")
		if code != 0 {
			t.Fatalf("exit %d, stderr:\n%s", code, stderr)
		}
		works(t, []byte(stdout), "e2e-pipe-sh")
		code, _, stderr = p.run(t, "bash", recipe, "kube-pipe")
		if code != 2 || !strings.Contains(stderr, "(Denied)") {
			t.Errorf("a refused request: exit %d, want 2 with the reason; stderr:\n%s", code, stderr)
		}
	})
}
