// Package realcluster drives a real one-node cluster (hack/real-cluster.sh) for the tests that
// need what only a real node does: a kubelet running Pods from images, pulling them through a
// registry mirror, mounting volumes, probing containers; Services and DNS through kube-proxy and
// CoreDNS. The node lives in a network namespace of its own with no route off the machine.
package realcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
// one (a leftover of the same name first torn down) and returns it. This process owns it: should it
// die without Down, the next gc tears the cluster down.
func Up(name string) (*Cluster, error) {
	if _, err := script("gc"); err != nil {
		return nil, err
	}
	if _, err := ownedScript(os.Getpid(), "up", name); err != nil {
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
	return testenv.Kubectl(ctx, c.BinDir, c.Kubeconfig, args...)
}

// PauseProgram is hack/node-image/pause built static: the program of the node's sandbox image and
// of the images tests push to an upstream (a container of them runs until it is stopped). Built
// once per process.
var PauseProgram = sync.OnceValues(func() ([]byte, error) {
	dir, err := os.MkdirTemp("", "qm-pause")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./hack/node-image/pause")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./hack/node-image/pause: %w\n%s", err, out)
	}
	return os.ReadFile(bin)
})

// ProjectImage is where LoadProjectImage puts make image's image on the node.
const ProjectImage = "docker.io/library/quartermaster"

// LoadProjectImage builds the manager's image as make image does, for this machine's platform only,
// tagged tag, and imports it into the node as ProjectImage:tag (the chart's image.repository
// "quartermaster" names it).
func (c *Cluster) LoadProjectImage(tag string) error {
	dir, err := os.MkdirTemp("", "qm-real-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "image.sh"), "build", "--out", dir, "--tag", tag,
		"--platforms", "linux/"+runtime.GOARCH)
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/image.sh build: %w\n%s", err, out)
	}
	return c.Load(ProjectImage, filepath.Join(dir, "quartermaster.oci.tar"))
}

// InstallChart installs (or upgrades) charts/quartermaster as release in namespace with the values
// file, as a platform admin would (helm upgrade --install --wait), and returns the time to every
// workload Ready. A Pod of the namespace that cannot start (its image not on the node, a crash)
// ends the wait at once with its reason.
func (c *Cluster) InstallChart(release, namespace, valuesFile string) (time.Duration, error) {
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := testenv.Helm4.Run("upgrade", "--install", release, filepath.Join(testenv.RepoRoot(), "charts", "quartermaster"),
			"--namespace", namespace, "--create-namespace", "-f", valuesFile, "--kubeconfig", c.Kubeconfig, "--wait", "--timeout", "3m")
		done <- err
	}()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return time.Since(start), err
		case <-tick.C:
			if err := c.StuckPods(context.Background(), namespace); err != nil {
				return 0, err
			}
		}
	}
}

// StuckPods returns an error naming each container of namespace's Pods that cannot start by
// itself: its image is not on the node (and may not be pulled), cannot be pulled, or it keeps
// crashing; nil when none is (or the API does not answer: the next look tells).
func (c *Cluster) StuckPods(ctx context.Context, namespace string) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil //nolint:nilerr // not knowing is no stuck Pod
	}
	var problems []string
	for _, p := range pods.Items {
		for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			w := s.State.Waiting
			if w == nil {
				continue
			}
			switch w.Reason {
			case "ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
				"CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff":
				problems = append(problems, fmt.Sprintf("pod %s/%s container %s (image %s): %s: %s",
					p.Namespace, p.Name, s.Name, s.Image, w.Reason, w.Message))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
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

func script(args ...string) ([]byte, error) { return ownedScript(0, args...) }

// ownedScript runs hack/real-cluster.sh; owner (not 0) is the pid a cluster it starts belongs to.
func ownedScript(owner int, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "real-cluster.sh"), args...)
	if owner != 0 {
		cmd.Env = append(os.Environ(), "QM_REAL_CLUSTER_OWNER="+strconv.Itoa(owner))
	}
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("hack/real-cluster.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
