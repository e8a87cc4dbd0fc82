// Package enginecrds installs the policy engines' own CustomResourceDefinitions in test API
// servers, so every generated KubeArmor and Kyverno policy is validated against the engine's
// schema. The CRDs come from the engines' Go modules (KubeArmor at the version Nimbus pins, Kyverno at
// the newest release the module proxy serves, as people run it), downloaded
// through the Go module proxy (nothing is copied into this repository).
package enginecrds

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The pinned engine modules and the CRD files inside them.
const (
	KubeArmorModule = "github.com/kubearmor/KubeArmor/pkg/KubeArmorController@v0.0.0-20240509053911-a5f584c38ee7"
	KyvernoModule   = "github.com/kyverno/kyverno@v1.19.1"
)

var (
	// KubeArmor are the KubeArmorPolicy CRD's files in its module.
	KubeArmor = []string{"config/crd/bases/security.kubearmor.com_kubearmorpolicies.yaml"}
	// Kyverno are the Policy and ClusterPolicy CRDs' files in its module.
	Kyverno = []string{"config/crds/kyverno/kyverno.io_policies.yaml", "config/crds/kyverno/kyverno.io_clusterpolicies.yaml"}
)

// Dir downloads module (cached by the go command) and copies the named files into a new folder,
// for envtest's CRDDirectoryPaths.
func Dir(t testing.TB, module string, files []string) string {
	t.Helper()
	dir := t.TempDir()
	if err := Copy(module, files, dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Copy downloads module (cached by the go command) and copies the named files into dir.
func Copy(module string, files []string, dir string) error {
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		return fmt.Errorf("go mod download %s: %w", module, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		return fmt.Errorf("go mod download %s: %s: %w", module, m.Error, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(m.Dir, f))
		if err != nil {
			return fmt.Errorf("%s has no %s: %w", module, f, err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
