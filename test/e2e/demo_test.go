//go:build e2e

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestDemoSteps runs `make demo`'s steps (hack/demo.sh check: everything the demo does, without
// its printing, failing at the first step that does not hold) on a cluster of its own, then
// `make demo-down`, and asserts that the demo left nothing behind: no process it started (Kyverno's
// included), no mount, no folder, no cluster. So the demo cannot rot.
func TestDemoSteps(t *testing.T) {
	parallel(t) // a cluster of its own
	demoCluster := clusterName + "-demo"
	script := filepath.Join(testenv.RepoRoot(), "hack", "demo.sh")
	run := func(mode string) (string, error) {
		var out bytes.Buffer
		cmd := exec.Command(script, mode)
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "QM_DEMO_CLUSTER="+demoCluster)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	cacheRoot := os.Getenv("QM_CACHE_DIR")
	if cacheRoot == "" {
		base, err := os.UserCacheDir()
		must(t, err)
		cacheRoot = filepath.Join(base, "quartermaster")
	}
	state := filepath.Join(cacheRoot, "demo-"+demoCluster)

	downDone := false
	t.Cleanup(func() {
		if !downDone {
			if out, err := run("down"); err != nil {
				t.Logf("hack/demo.sh down: %v\n%s", err, out)
			}
		}
	})
	out, err := run("check")
	// What the check started, to be found gone after down.
	var pids []int
	files, _ := filepath.Glob(filepath.Join(state, "*.pid"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid)
		}
	}
	if err != nil {
		logs := ""
		for _, f := range []string{"manager.log", "kyverno.log", "mirror-cache.log", "node-agent.log", "containerd.log"} {
			if b, err := os.ReadFile(filepath.Join(state, f)); err == nil {
				logs += "=== " + f + "\n" + tail(string(b), 40) + "\n"
			}
		}
		t.Fatalf("hack/demo.sh check: %v\n%s\n%s", err, out, logs)
	}
	t.Logf("hack/demo.sh check:\n%s", out)
	if len(pids) < 8 {
		t.Errorf("the demo recorded %d processes, want its 8 (manager, simulators, upstream, Kyverno, containerd, cache, agent)", len(pids))
	}

	downDone = true
	if out, err := run("down"); err != nil {
		t.Fatalf("hack/demo.sh down: %v\n%s", err, out)
	}
	for _, pid := range pids {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			t.Errorf("process %d the demo started runs after down: %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	// Kyverno's processes (children of the demo's helper) and anything else pointed at the folder.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err == nil && bytes.Contains(cmdline, []byte(state)) {
			t.Errorf("%s runs after down: %s", filepath.Dir(p), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil && bytes.Contains(mounts, []byte(state)) {
		t.Errorf("mounts under %s are left after down", state)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the demo's folder %s is left after down (%v)", state, err)
	}
	if _, err := os.Stat(filepath.Join(cacheRoot, "clusters", demoCluster)); !os.IsNotExist(err) {
		t.Errorf("the demo's cluster %s is left after down (%v)", demoCluster, err)
	}
	if _, err := os.Stat(filepath.Join(cacheRoot, "kwok", "clusters", demoCluster)); !os.IsNotExist(err) {
		t.Errorf("kwokctl still has the demo's cluster %s after down (%v)", demoCluster, err)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
