//go:build e2e

package realnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/realcluster"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestSecondClusterBesideAndKilledMidStart: a second real cluster starts while the suite's runs (no
// fixed name, address or port between them). Its start is killed midway together with the run that
// owns it (SIGKILL, as a CI job cancelled): the daemons it had started go on running, and the next
// `gc` (which every run's Up does first) tears the cluster down without touching the suite's. A
// whole start and `down` then leave nothing on the machine: no process started from its folder, no
// veth, route, mount or cgroup, the kubelet's sysctls as they were, no folder.
func TestSecondClusterBesideAndKilledMidStart(t *testing.T) {
	name := cluster.Name + "-2"
	dir := filepath.Join(filepath.Dir(cluster.Dir), name)
	script := filepath.Join(testenv.RepoRoot(), "hack", "real-cluster.sh")
	// A leftover of an interrupted run of this test goes first.
	if out, err := exec.Command(script, "down", name).CombinedOutput(); err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	before := machineState(t, dir)

	// The run that owns it: a process of its own, killed with the start.
	owner := exec.Command("sleep", "600")
	must(t, owner.Start())
	cmd := exec.Command(script, "up", name)
	cmd.Env = append(os.Environ(), fmt.Sprintf("QM_REAL_CLUSTER_OWNER=%d", owner.Process.Pid))
	// Its own process group, killed whole as a cancelled job's: the script and the commands it
	// waits on; the daemons it started run in sessions of their own and survive.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	eventually(t, "the second cluster's API server to start", func() bool {
		_, err := os.Stat(filepath.Join(dir, "pids", "kube-apiserver"))
		return err == nil
	})
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = owner.Process.Kill()
	_ = cmd.Wait()
	_ = owner.Wait()
	if machineState(t, dir) == before {
		t.Fatalf("the killed start left nothing running: the test shows nothing\n%s", stderr.String())
	}
	out, err := exec.Command(script, "gc").CombinedOutput()
	if err != nil {
		t.Fatalf("gc: %v\n%s", err, out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("gc left the killed cluster's folder: %v\n%s", err, out)
	}
	if !cluster.Running() {
		t.Fatal("gc stopped the suite's running cluster")
	}
	if after := machineState(t, dir); after != before {
		t.Errorf("the killed start left on the machine:\nbefore: %s\nafter:  %s", before, after)
	}

	// A whole start beside the suite's cluster, then down.
	second, err := realcluster.Up(name)
	must(t, err)
	if second.HostIP == cluster.HostIP {
		t.Errorf("both clusters took %s", second.HostIP)
	}
	if _, err := second.Kubectl(context.Background(), "wait", "--for=condition=Ready", "node", "--all", "--timeout=60s"); err != nil {
		t.Error(err)
	}
	must(t, second.Down())
	if after := machineState(t, dir); after != before {
		t.Errorf("down left on the machine:\nbefore: %s\nafter:  %s", before, after)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("down left the folder %s", dir)
	}
}

// machineState is what a cluster changes on the machine, besides its folder: veths, routes, mounts
// and processes mentioning dir (when given), the kubelet's cgroup roots, the kubelet's sysctls.
func machineState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, l := range strings.Split(string(links), "\n") {
		if strings.Contains(l, ": qmh") {
			b.WriteString("link " + strings.Fields(l)[1] + " ")
		}
	}
	routes, _ := exec.Command("ip", "-4", "route", "show").Output()
	b.WriteString("routes " + strings.Join(strings.Fields(string(routes)), " ") + " ")
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/qm-*")
	b.WriteString("cgroups " + strings.Join(cgroups, ",") + " ")
	for _, k := range []string{"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom"} {
		v, _ := os.ReadFile("/proc/sys/" + k)
		b.WriteString(k + "=" + strings.TrimSpace(string(v)) + " ")
	}
	if dir != "" {
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if bytes.Contains(mounts, []byte(dir)) {
			b.WriteString("mounts under " + dir + " ")
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			c, _ := os.ReadFile(p)
			if bytes.Contains(c, []byte(dir+"/")) {
				b.WriteString("process " + strings.ReplaceAll(string(c), "\x00", " ") + " ")
			}
		}
	}
	return b.String()
}

// TestNodeBinRebuildsWhatIsMissingOrStale: hack/node-bin.sh, run against a copy of the cache in
// which one CNI plugin is missing and CoreDNS answers --version with an older release, rebuilds those
// two (and says why) and reuses the rest; the cache the suite runs from is not touched.
func TestNodeBinRebuildsWhatIsMissingOrStale(t *testing.T) {
	script := filepath.Join(testenv.RepoRoot(), "hack", "node-bin.sh")
	out, err := exec.Command(script).Output()
	must(t, err)
	folders := map[string]string{} // component → its folder in the suite's cache
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, dir, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("node-bin.sh printed %q", l)
		}
		folders[name] = dir
	}
	// The copy: hard links in the same file system (a rebuilt binary replaces its link, never the
	// file it shares with the suite's cache).
	copyRoot, err := os.MkdirTemp(filepath.Dir(folders["coredns"]), ".node-bin-test-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(copyRoot) })
	for _, dir := range folders {
		if out, err := exec.Command("cp", "-al", dir, copyRoot+"/").CombinedOutput(); err != nil {
			t.Fatalf("cp -al %s: %v\n%s", dir, err, out)
		}
	}
	copied := func(component, file string) string {
		return filepath.Join(copyRoot, filepath.Base(folders[component]), file)
	}
	must(t, os.Remove(copied("cni", "loopback")))
	stale := copied("coredns", "coredns")
	must(t, os.Remove(stale))
	must(t, os.WriteFile(stale, []byte("#!/bin/sh\necho CoreDNS-1.14.2\necho linux/amd64, go1.25.0\n"), 0o755))
	suiteCoreDNS, err := os.Stat(filepath.Join(folders["coredns"], "coredns"))
	must(t, err)

	cmd := exec.Command(script)
	cmd.Env = append(os.Environ(), "QM_CACHE_DIR="+copyRoot)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("node-bin.sh on the copy: %v\n%s", err, stderr.String())
	}
	log := stderr.String()
	for _, want := range []string{
		"coredns in the cache is not 1.15.0 (CoreDNS-1.14.2): rebuilding it",
		"building loopback",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("node-bin.sh did not say %q:\n%s", want, log)
		}
	}
	for _, reused := range []string{"kubelet", "kube-proxy", "runc", "containerd", "bridge", "host-local", "portmap"} {
		if strings.Contains(log, "building "+reused+" ") || strings.Contains(log, reused+" in the cache is not") {
			t.Errorf("node-bin.sh rebuilt %s, which was in the cache at its version:\n%s", reused, log)
		}
	}
	if !strings.Contains(string(out), "coredns="+filepath.Join(copyRoot, filepath.Base(folders["coredns"]))) {
		t.Errorf("node-bin.sh did not name the copy's folders:\n%s", out)
	}
	version, err := exec.Command(stale, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(version), "CoreDNS-1.15.0") {
		t.Errorf("the rebuilt coredns answers %q (%v), not 1.15.0", version, err)
	}
	if st, err := os.Stat(copied("cni", "loopback")); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("loopback was not rebuilt: %v", err)
	}
	if st, err := os.Stat(filepath.Join(folders["coredns"], "coredns")); err != nil || !os.SameFile(st, suiteCoreDNS) {
		t.Errorf("the suite's coredns was replaced (%v)", err)
	}
}
