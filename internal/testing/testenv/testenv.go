// Package testenv starts the real Kubernetes API servers the tests run against: envtest
// (kube-apiserver and etcd built from source by hack/k8s-bin.sh) loaded with the project's CRDs.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/quartermaster-dev/quartermaster/internal/manager"
)

// GoBuild builds the repository's main package pkg (e.g. ./cmd/quartermaster) into out, for tests
// and benchmarks that run a binary as its own process.
func GoBuild(out, pkg string) error {
	return goBuild(exec.Command("go", "build", "-o", out, pkg), pkg)
}

// GoBuildAsShipped builds pkg into out as the image does (hack/image): static (no cgo, so no C
// library mapped beside it) and stripped, for measuring what users run.
func GoBuildAsShipped(out, pkg string) error {
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	return goBuild(build, pkg)
}

func goBuild(build *exec.Cmd, pkg string) error {
	build.Dir = RepoRoot()
	if output, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %w\n%s", pkg, err, output)
	}
	return nil
}

// RepoRoot is the repository's top folder, found from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

var (
	assetsOnce sync.Once
	assetsDir  string
	assetsErr  error
)

// AssetsDir returns the folder holding kube-apiserver, etcd, kubectl and the other locally built
// binaries: KUBEBUILDER_ASSETS when set, otherwise the cache hack/k8s-bin.sh fills (building the
// binaries on first use).
func AssetsDir() (string, error) {
	assetsOnce.Do(func() {
		if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
			assetsDir = dir
			return
		}
		var stderr bytes.Buffer
		cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "k8s-bin.sh"))
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			assetsErr = fmt.Errorf("building the Kubernetes binaries (hack/k8s-bin.sh): %w\n%s", err, stderr.String())
			return
		}
		assetsDir = LastLine(out)
	})
	return assetsDir, assetsErr
}

// Assets is AssetsDir for tests.
func Assets(t testing.TB) string {
	t.Helper()
	dir, err := AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// LastLine returns the last non-empty line of a script's output (the scripts print their result there).
func LastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// Env is a running envtest API server.
type Env struct {
	*envtest.Environment
	Config *rest.Config
	Client client.Client
}

// Start runs kube-apiserver and etcd with the CRDs under config/crd/bases installed, and stops
// them when the test ends. extraCRDDirs adds test-only CRDs. A test that starts its own server
// needs one nobody else touches (its CRDs installed or removed, a server stopped under it): say
// why beside the call. Every other test shares its package's (Package).
func Start(t testing.TB, extraCRDDirs ...string) *Env {
	t.Helper()
	env, err := start(extraCRDDirs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	return env
}

func start(extraCRDDirs ...string) (*Env, error) {
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append([]string{filepath.Join(RepoRoot(), "config", "crd", "bases")}, extraCRDDirs...),
		Scheme:                manager.Scheme(apiextensionsv1.AddToScheme),
		// envtest gives etcd and kube-apiserver 20 s to start: on a busy machine (two lanes of
		// make test, several servers of one package starting at once) an API server took longer
		// and the test failed for the machine's speed. The limit bounds a failure only.
		ControlPlaneStartTimeout: 2 * time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &Env{Environment: env, Config: cfg, Client: c}, nil
}

// Package runs a package's tests (m.Run) against one API server, started before the first test
// and stopped after the last, and returns the exit code for TestMain:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Package(m, &env, nil)) }
//
// *env is set before any test runs; setup, when not nil, runs once the server is up (what every
// test of the package needs: a namespace, a CRD). Tests sharing it keep to their own namespaces
// and names (Namespace) and may run in parallel. Starting the server costs 3-10 s: once per
// package, not per test.
func Package(m *testing.M, env **Env, setup func(*Env) error, extraCRDDirs ...string) int {
	e, err := start(extraCRDDirs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}()
	if setup != nil {
		if err := setup(e); err != nil {
			fmt.Fprintln(os.Stderr, "setting up envtest:", err)
			return 1
		}
	}
	*env = e
	return m.Run()
}

// Namespace creates a namespace of the test's own (its name made from the test's, unique in the
// package's server) and returns its name. envtest runs no namespace controller, so it is not
// deleted: it is only the test's.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	name := namespaceName(t.Name())
	if err := e.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("creating the test's namespace %s: %v", name, err)
	}
	return name
}

var namespaceSeq atomic.Int64

// namespaceName is a DNS label from a test's name and a sequence number: lower case, [a-z0-9-],
// at most 63 characters.
func namespaceName(test string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(test) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	suffix := fmt.Sprintf("-%d", namespaceSeq.Add(1))
	base := strings.TrimRight(b.String(), "-")
	if limit := 63 - len(suffix); len(base) > limit {
		base = strings.TrimRight(base[:limit], "-")
	}
	return base + suffix
}

// KubeconfigFor writes a kubeconfig for a user of the environment and returns its path. Users are
// authenticated by client certificate; groups such as system:masters make an admin.
func (e *Env) KubeconfigFor(t testing.TB, name string, groups ...string) string {
	t.Helper()
	u, err := e.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
