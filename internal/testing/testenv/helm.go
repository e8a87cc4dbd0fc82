package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Helm is a major version of the helm command. Each is built from the module proxy by a tool
// module of its own (cached by Go's build cache) and run through hack/helm.sh: Helm4 from
// hack/tools/helm, Helm3 from hack/tools/helm3.
type Helm int

// The majors, each built by hack/helm.sh (QM_HELM_MAJOR).
const (
	Helm3 Helm = 3
	Helm4 Helm = 4
)

// Helms are the majors the chart is tested with, the project's own first.
var Helms = []Helm{Helm4, Helm3}

func (h Helm) String() string { return fmt.Sprintf("helm%d", int(h)) }

// Run runs helm in the repository's top folder, so relative paths such as charts/quartermaster
// work, and returns its standard output.
func (h Helm) Run(args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "helm.sh"), args...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), fmt.Sprintf("QM_HELM_MAJOR=%d", int(h)))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", h, strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
