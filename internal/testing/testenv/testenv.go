// Package testenv starts the real Kubernetes API servers the tests run against: envtest
// (kube-apiserver and etcd built from source by hack/k8s-bin.sh) loaded with the project's CRDs.
package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
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
// them when the test ends. extraCRDDirs adds test-only CRDs.
func Start(t testing.TB, extraCRDDirs ...string) *Env {
	t.Helper()
	env := &envtest.Environment{
		BinaryAssetsDirectory: Assets(t),
		CRDDirectoryPaths:     append([]string{filepath.Join(RepoRoot(), "config", "crd", "bases")}, extraCRDDirs...),
		Scheme:                manager.Scheme(apiextensionsv1.AddToScheme),
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &Env{Environment: env, Config: cfg, Client: c}
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
