package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// EarlierRelease is the release an upgrade comes from: the commit hack/earlier-release names (the
// newest that landed) and its tree, extracted (git archive) once per commit into the cache
// (CacheDir()/releases/COMMIT/src, shared by every test and run; never write into it). CI must
// clone the history, not a shallow copy.
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
	dir, err = cachedBuild(filepath.Join("releases", commit, "src"), func(tmp string) error {
		if out, err := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("extracting %s: %w\n%s", commit, err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return commit, dir
}

// EarlierReleaseBuild is a file the earlier release's tree builds (its manager, its image), made
// by build (run in the release's tree, writing into out) once per commit and kept in the cache
// beside the tree as NAME: the upgrade tests of every run after the first start at once. It
// returns the file's path.
func EarlierReleaseBuild(t testing.TB, name string, build func(src, out string) error) (commit, path string) {
	t.Helper()
	commit, src := EarlierRelease(t)
	dir, err := cachedBuild(filepath.Join("releases", commit, name), func(tmp string) error { return build(src, tmp) })
	if err != nil {
		t.Fatalf("building the earlier release's %s (%s): %v", name, commit, err)
	}
	return commit, dir
}

// CacheDir is where the project's scripts keep what they build: $QM_CACHE_DIR, else
// $XDG_CACHE_HOME/quartermaster (~/.cache/quartermaster).
func CacheDir() string {
	if dir := os.Getenv("QM_CACHE_DIR"); dir != "" {
		return dir
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	return filepath.Join(base, "quartermaster")
}

// cachedBuild returns CacheDir()/rel, made by fill (into a temporary folder beside it, renamed
// into place whole) when it does not exist yet. A lock file makes concurrent processes fill it
// once; a fill that failed or was killed leaves nothing behind but its temporary folder, removed
// by the next.
func cachedBuild(rel string, fill func(tmp string) error) (string, error) {
	dir := filepath.Join(CacheDir(), rel)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing unlocks too
	if _, err := os.Stat(dir); err == nil {
		return dir, nil // filled while we waited
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := fill(tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	return dir, os.Rename(tmp, dir)
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
