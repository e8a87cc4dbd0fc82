// Package localcluster drives the local kwok cluster (hack/cluster.sh) for the e2e tests and the
// benchmarks, and hands out credentials of ServiceAccounts on it.
package localcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/quartermaster-dev/quartermaster/internal/kubeconfig"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// Cluster is a running local cluster.
type Cluster struct {
	Name       string
	Kubeconfig string // admin kubeconfig path
	Config     *rest.Config
	BinDir     string // the locally built kubectl, kube-apiserver, … live here
}

// Up creates (or restarts) the named cluster with the given number of fake nodes.
func Up(name string, nodes int) (*Cluster, error) {
	out, err := script("up", name, strconv.Itoa(nodes))
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", out)
	if err != nil {
		return nil, err
	}
	cfg.QPS = -1 // as the manager's client: no client-side rate limit (the server's APF applies)
	bin, err := testenv.AssetsDir()
	if err != nil {
		return nil, err
	}
	return &Cluster{Name: name, Kubeconfig: out, Config: cfg, BinDir: bin}, nil
}

// Down deletes the named cluster.
func Down(name string) error {
	_, err := script("down", name)
	return err
}

// Kubectl runs the locally built kubectl as the cluster admin and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return testenv.Kubectl(ctx, c.BinDir, c.Kubeconfig, args...)
}

// ServiceAccountKubeconfig requests a token for namespace/name through the TokenRequest API and
// returns a kubeconfig that authenticates with it, and the token.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name string, ttl time.Duration) ([]byte, string, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, "", err
	}
	secs := int64(ttl.Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, "", err
	}
	ca := c.Config.CAData
	if len(ca) == 0 && c.Config.CAFile != "" {
		if ca, err = os.ReadFile(c.Config.CAFile); err != nil {
			return nil, "", err
		}
	}
	data, err := kubeconfig.Render(kubeconfig.Params{
		Name: name, Server: c.Config.Host, CAData: ca, Token: tr.Status.Token, Namespace: namespace,
	})
	return data, tr.Status.Token, err
}

func script(args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "hack", "cluster.sh"), args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/cluster.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return testenv.LastLine(out), nil
}
