package testenv

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
)

// Helm runs helm (v4, hack/tools/helm/go.mod: built from the module proxy, cached by Go's build
// cache) in the repository's top folder, so relative paths such as charts/quartermaster work, and
// returns its standard output.
func Helm(args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"tool", "-modfile=hack/tools/helm/go.mod", "helm"}, args...)...)
	cmd.Dir = RepoRoot()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
