//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// A containerd daemon of the test's own, run as root (it mounts snapshots): its own root, state,
// sockets and configuration, and the node's /etc/containerd a directory of the test, as the node
// agent's DaemonSet sees it through its host mount. It pulls images (CRI PullImage, as a kubelet
// does) and runs no container, so it needs no runc and no CNI.
type containerdNode struct {
	// Root is the node's filesystem as the node agent sees it (its --root): Root/etc/containerd
	// is the daemon's /etc/containerd.
	Root   string
	proc   *process
	images runtimeapi.ImageServiceClient
}

var containerdBinary = sync.OnceValues(func() (string, error) {
	out, err := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "containerd-bin.sh")).Output()
	if err != nil {
		return "", fmt.Errorf("hack/containerd-bin.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return filepath.Join(lines[len(lines)-1], "containerd"), nil
})

// startContainerd runs containerd with images configuration registry (TOML added to the file,
// e.g. the images plugin's registry table; empty is containerd's default) and waits until its CRI
// answers.
func startContainerd(t *testing.T, registry string) *containerdNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("containerd must run as root here (it mounts snapshots); the e2e suite runs as root in CI")
	}
	bin, err := containerdBinary()
	must(t, err)
	// Not t.TempDir: a unix socket's path must stay under 108 bytes.
	dir, err := os.MkdirTemp("", "qm-ctrd-")
	must(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	node := &containerdNode{Root: filepath.Join(dir, "node")}
	etc := filepath.Join(node.Root, "etc", "containerd")
	must(t, os.MkdirAll(etc, 0o755))
	sock := filepath.Join(dir, "containerd.sock")
	// Everything containerd would write outside its root and state moved into dir, or off: the
	// NRI socket (/var/run/nri) and the opt plugin's /opt/containerd.
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

%s`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"), registry)
	must(t, os.WriteFile(filepath.Join(etc, "config.toml"), []byte(config), 0o644))

	node.proc = startInMounts(t, "containerd", []mount{{source: etc, target: "/etc/containerd"}}, nil,
		bin, "--config", "/etc/containerd/config.toml")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	must(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	node.images = runtimeapi.NewImageServiceClient(conn)
	eventually(t, "containerd's CRI to answer", func() bool {
		select {
		case err := <-node.proc.done:
			node.proc.stopped = true // it exited: nothing to stop
			t.Fatalf("containerd exited: %v\n%s", err, node.proc.logs)
		default:
		}
		_, err := node.images.ListImages(context.Background(), &runtimeapi.ListImagesRequest{})
		return err == nil
	})
	return node
}

// pull pulls ref as a kubelet does: CRI PullImage, with the credentials of an imagePullSecret
// when auth is given.
func (n *containerdNode) pull(ctx context.Context, ref string, auth *runtimeapi.AuthConfig) error {
	_, err := n.images.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}, Auth: auth})
	return err
}

// remove deletes ref from containerd; its content goes with it (CRI deletes synchronously), so
// the next pull fetches every blob again.
func (n *containerdNode) remove(t *testing.T, ref string) {
	t.Helper()
	_, err := n.images.RemoveImage(context.Background(), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	must(t, err)
	st, err := n.images.ImageStatus(context.Background(), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	must(t, err)
	if st.Image != nil {
		t.Fatalf("%s is still in containerd after RemoveImage", ref)
	}
}

// mount shows a directory of the test (source) at target inside a process's mount namespace, as
// a volume in a container.
type mount struct{ source, target string }

// startInMounts runs command in a mount namespace of its own where each mount is bound at its
// target (as root). A target that does not exist on this machine is made on a tmpfs laid over
// its deepest existing parent, hiding that parent's content from the process only: nothing is
// created or changed outside the test's directories.
func startInMounts(t *testing.T, name string, mounts []mount, env []string, command ...string) *process {
	t.Helper()
	var tmpfs []string
	for _, m := range mounts {
		if _, err := os.Stat(m.target); err == nil {
			continue
		}
		parent := filepath.Dir(m.target)
		for {
			if _, err := os.Stat(parent); err == nil {
				break
			}
			parent = filepath.Dir(parent)
		}
		tmpfs = append(tmpfs, parent)
	}
	sort.Strings(tmpfs)
	var script strings.Builder
	script.WriteString("set -e\n")
	for i, dir := range tmpfs {
		if i > 0 && dir == tmpfs[i-1] {
			continue
		}
		fmt.Fprintf(&script, "mount -t tmpfs tmpfs %s\n", shellQuote(dir))
	}
	for _, m := range mounts {
		fmt.Fprintf(&script, "mkdir -p %s\nmount --bind %s %s\n", shellQuote(m.target), shellQuote(m.source), shellQuote(m.target))
	}
	script.WriteString(`exec "$@"` + "\n")
	args := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script.String(), "sh"}, command...)
	return startProcess(t, name, exec.Command("unshare", args...), env)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// startProcess starts cmd with env added to the test's environment (processEnv); it is stopped
// when the test ends and its output is shown if the test failed.
func startProcess(t *testing.T, name string, cmd *exec.Cmd, env []string) *process {
	t.Helper()
	p := &process{name: name, cmd: cmd, logs: &testenv.LogBuffer{}, done: make(chan error, 1)}
	p.cmd.Env = processEnv(env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	must(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.logs)
		}
	})
	return p
}
