package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// EarlierRelease is the release an upgrade comes from: the commit hack/earlier-release names (the
// newest that landed), its tree extracted (git archive) into a folder of the test's. CI must clone
// the history, not a shallow copy.
func EarlierRelease(t testing.TB) (commit, dir string) {
	t.Helper()
	root := RepoRoot()
	data, err := os.ReadFile(filepath.Join(root, "hack", "earlier-release"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			commit = line
		}
	}
	if out, err := exec.Command("git", "-C", root, "merge-base", "--is-ancestor", commit, "HEAD").CombinedOutput(); err != nil {
		t.Fatalf("hack/earlier-release names %q, which is not in HEAD's history (a shallow clone? CI needs the history): %v\n%s", commit, err, out)
	}
	dir = t.TempDir()
	if out, err := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, dir).CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v\n%s", commit, err, out)
	}
	return commit, dir
}

// Kubectl runs bin/kubectl with kubeconfig from the repository's top folder and returns its
// combined output (an error carries it too).
func Kubectl(ctx context.Context, bin, kubeconfig string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Dir = RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
