package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// managerProcess is the quartermaster binary running as its own process against the bench
// cluster, so its memory is its own (an in-process manager shares the bench's heap).
type managerProcess struct {
	cmd   *exec.Cmd
	logs  *testenv.LogBuffer
	done  chan error
	pprof string // the address of its /debug/pprof endpoints, with -profiles

	stopOnce sync.Once
	stopErr  error
}

// profilesDir is the -profiles flag: where heap profiles of manager processes go ("": none taken).
var profilesDir string

// binDir is where run builds the manager binary, once per report (removed at the end).
var binDir string

var managerBuild struct {
	once sync.Once
	err  error
}

// managerBinary builds cmd/quartermaster into binDir the first time it is called, as the image
// does. The binary is flushed to disk, as an installed one is: the kernel cannot drop the dirty pages of a file just
// written, so a fresh build would keep the start-up pages the manager gives back (codepages)
// resident for the first half minute.
func managerBinary() (string, error) {
	bin := filepath.Join(binDir, "quartermaster")
	managerBuild.once.Do(func() {
		if managerBuild.err = testenv.GoBuildAsShipped(bin, "./cmd/quartermaster"); managerBuild.err == nil {
			managerBuild.err = syncFile(bin)
		}
	})
	return bin, managerBuild.err
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// startProcess runs the manager binary with args as the cluster's admin.
func startProcess(e *env, args ...string) (*managerProcess, error) {
	return startProcessWithEnv(e, nil, args...)
}

// startProcessWithEnv is startProcess with variables added to the process's environment.
func startProcessWithEnv(e *env, environ []string, args ...string) (*managerProcess, error) {
	bin, err := managerBinary()
	if err != nil {
		return nil, err
	}
	p := &managerProcess{logs: &testenv.LogBuffer{}, done: make(chan error, 1)}
	flags := []string{"--health-probe-bind-address=0", "--metrics-bind-address=0"}
	if profilesDir != "" {
		addr, err := freePort()
		if err != nil {
			return nil, err
		}
		p.pprof = addr
		flags = append(flags, "--pprof-bind-address="+p.pprof)
	}
	p.cmd = exec.Command(bin, append(flags, args...)...)
	p.cmd.Env = append(append(os.Environ(), "KUBECONFIG="+e.cluster.Kubeconfig), environ...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p, nil
}

// rssMiB is the process's resident set size now.
func (p *managerProcess) rssMiB() (float64, error) {
	m, err := p.memory()
	return m["VmRSS"], err
}

// saveHeapProfile writes the process's heap profile (after a collection) to name in profilesDir,
// and its memory map with each mapping's resident size (/proc/PID/smaps) to name.smaps, when
// -profiles is given.
func (p *managerProcess) saveHeapProfile(name string) error {
	if p.pprof == "" {
		return nil
	}
	if err := os.MkdirAll(profilesDir, 0o755); err != nil {
		return err
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", p.cmd.Process.Pid))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(profilesDir, name+".smaps"), smaps, 0o644); err != nil {
		return err
	}
	return p.savePprof("heap?gc=1", name)
}

// savePprof writes what the process's /debug/pprof/<path> answers to name in profilesDir.
func (p *managerProcess) savePprof(path, name string) error {
	resp, err := http.Get("http://" + p.pprof + "/debug/pprof/" + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	if err := os.MkdirAll(profilesDir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(profilesDir, name))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// startCPUProfile starts a CPU profile of the process over d, written to name in profilesDir,
// when -profiles is given; the returned func waits for it.
func (p *managerProcess) startCPUProfile(name string, d time.Duration) func() error {
	if p.pprof == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() { done <- p.savePprof(fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), name) }()
	return func() error { return <-done }
}

// cpuSeconds is the CPU time the process has used so far, user and system (/proc/PID/stat).
func (p *managerProcess) cpuSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces: count from the last ")".
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", p.cmd.Process.Pid, b)
	}
	var ticks float64
	for _, f := range fields[11:13] { // utime and stime, fields 14 and 15 of stat
		n, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return ticks / clockTicksPerSecond, nil
}

// clockTicksPerSecond is USER_HZ, the unit of /proc times: 100 on every Linux architecture Go
// supports.
const clockTicksPerSecond = 100

// rssSplit says how much of the resident set is the process's own memory (heap, stacks) and how
// much the pages of its binary and other files, which the kernel can drop and read back.
func (p *managerProcess) rssSplit() string {
	m, err := p.memory()
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("anonymous %.1f, file-backed %.1f MiB", m["RssAnon"], m["RssFile"])
}

// memory is the process's /proc status memory lines, in MiB.
func (p *managerProcess) memory() (map[string]float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.HasSuffix(value, " kB") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(value, " kB")), 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/status %s: %w", p.cmd.Process.Pid, key, err)
		}
		m[key] = kb / 1024
	}
	if _, ok := m["VmRSS"]; !ok {
		return nil, fmt.Errorf("no VmRSS in /proc/%d/status", p.cmd.Process.Pid)
	}
	return m, sc.Err()
}

// stop ends the process (SIGTERM) and returns its logs when it did not exit cleanly. Later calls
// return the same, so a case may defer it and also stop early.
func (p *managerProcess) stop() error {
	p.stopOnce.Do(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		if err := <-p.done; err != nil {
			p.stopErr = fmt.Errorf("manager exited with %w:\n%s", err, p.logs.Tail(4000))
		}
	})
	return p.stopErr
}
