package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// EarlierRelease finds the newest commit on HEAD's first-parent history whose charts/ differs from
// HEAD's (the release an upgrade comes from) and extracts its tree (git archive) into a folder of
// the test's. CI must clone the history, not a shallow copy.
func EarlierRelease(t testing.TB) (commit, dir string) {
	t.Helper()
	root := RepoRoot()
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	revs, err := git("rev-list", "--first-parent", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	for rev := range strings.FieldsSeq(revs) {
		if _, err := git("diff", "--quiet", rev, "HEAD", "--", "charts/"); err != nil {
			commit = rev
			break
		}
	}
	if commit == "" {
		t.Fatal("no commit of HEAD's history has a chart that differs from HEAD's (a shallow clone? CI needs the history)")
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
