package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// managerProcess is the quartermaster binary running as its own process against the bench
// cluster, so its memory is its own (an in-process manager shares the bench's heap).
type managerProcess struct {
	cmd  *exec.Cmd
	logs *testenv.LogBuffer
	done chan error
}

// startProcess builds cmd/quartermaster into dir and runs it with args as the cluster's admin.
func startProcess(e *env, dir string, args ...string) (*managerProcess, error) {
	bin := filepath.Join(dir, "quartermaster")
	if err := testenv.GoBuild(bin, "./cmd/quartermaster"); err != nil {
		return nil, err
	}
	p := &managerProcess{logs: &testenv.LogBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"--health-probe-bind-address=0", "--metrics-bind-address=0"}, args...)...)
	p.cmd.Env = append(os.Environ(), "KUBECONFIG="+e.cluster.Kubeconfig)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p, nil
}

// rssMiB is the process's resident set size now.
func (p *managerProcess) rssMiB() (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.cmd.Process.Pid)
}

// stop ends the process (SIGTERM) and returns its logs when it did not exit cleanly.
func (p *managerProcess) stop() error {
	_ = p.cmd.Process.Signal(os.Interrupt)
	if err := <-p.done; err != nil {
		return fmt.Errorf("manager exited with %w:\n%s", err, p.logs.Tail(4000))
	}
	return nil
}
