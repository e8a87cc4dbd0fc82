// Package realcluster drives a real one-node cluster (hack/real-cluster.sh) for the tests that
// need what only a real node does: a kubelet running Pods from images, pulling them through a
// registry mirror, mounting volumes, probing containers; Services and DNS through kube-proxy and
// CoreDNS. The node lives in a network namespace of its own with no route off the machine.
package realcluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// Cluster is a running real cluster; its fields are hack/real-cluster.sh env's.
type Cluster struct {
	Name       string
	Dir        string // the cluster's folder (logs/ has each component's log)
	Kubeconfig string // the admin kubeconfig
	Config     *rest.Config
	// HostIP is the host's address on the node's link: servers a test runs for Pods or the node
	// to reach (an upstream registry, an emulator) listen here.
	HostIP      string
	NodeIP      string
	NodeName    string
	PodCIDR     string
	ServiceCIDR string
	// Containerd is the node's containerd socket (the CRI; a path socket, reachable from the
	// host's namespaces); CTR its ctr binary.
	Containerd string
	CTR        string
	// BinDir holds the control plane's binaries (kubectl).
	BinDir string
	// NodeNet and NodeMnt are the node's network and mount namespaces (files for nsenter).
	NodeNet, NodeMnt string
}

// Up tears down real clusters left by killed runs (hack/real-cluster.sh gc), then starts the named
// one (a leftover of the same name first torn down) and returns it.
func Up(name string) (*Cluster, error) {
	if _, err := script("gc"); err != nil {
		return nil, err
	}
	if _, err := script("up", name); err != nil {
		return nil, err
	}
	return Open(name)
}

// Open returns the running cluster name.
func Open(name string) (*Cluster, error) {
	out, err := script("env", name)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			env[k] = v
		}
	}
	c := &Cluster{
		Name: name, Dir: env["DIR"], Kubeconfig: env["KUBECONFIG"], HostIP: env["HOST_IP"], NodeIP: env["NODE_IP"],
		NodeName: env["NODE_NAME"], PodCIDR: env["POD_CIDR"], ServiceCIDR: env["SERVICE_CIDR"],
		Containerd: env["CONTAINERD"], CTR: env["CTR"], BinDir: env["BIN"], NodeNet: env["NODE_NET"], NodeMnt: env["NODE_MNT"],
	}
	if c.Kubeconfig == "" || c.HostIP == "" || c.Containerd == "" {
		return nil, fmt.Errorf("hack/real-cluster.sh env %s: incomplete:\n%s", name, out)
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	c.Config.QPS = -1
	return c, nil
}

// Running tells whether the cluster's API server answers.
func (c *Cluster) Running() bool {
	_, err := c.Kubectl(context.Background(), "get", "--raw", "/readyz", "--request-timeout=5s")
	return err == nil
}

// Down stops the cluster and puts back everything it changed.
func (c *Cluster) Down() error {
	_, err := script("down", c.Name)
	return err
}

// Load imports image archives into the node's containerd; baseName (empty: none) names the images
// of an OCI archive that names only their tag (make image's).
func (c *Cluster) Load(baseName string, archives ...string) error {
	args := []string{"load", c.Name}
	if baseName != "" {
		args = append(args, "--base-name", baseName)
	}
	_, err := script(append(args, archives...)...)
	return err
}

// InNode runs a command in the node's namespaces and returns its combined output.
func (c *Cluster) InNode(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--mount=" + c.NodeMnt, "--net=" + c.NodeNet, "--"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("in the node: %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// Kubectl runs kubectl as the cluster admin and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Images returns a client of the node's CRI image service (what the kubelet pulls and removes
// images with); close the connection when done.
func (c *Cluster) Images() (runtimeapi.ImageServiceClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+c.Containerd, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewImageServiceClient(conn), conn, nil
}

// Log returns the last n lines of a component's log (etcd, kube-apiserver, kubelet, containerd, …).
func (c *Cluster) Log(component string, n int) string {
	data, err := os.ReadFile(filepath.Join(c.Dir, "logs", component+".log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func script(args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "real-cluster.sh"), args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("hack/real-cluster.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
