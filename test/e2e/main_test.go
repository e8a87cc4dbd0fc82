//go:build e2e

// Package e2e runs end-to-end tests on a local kwok cluster (hack/cluster.sh) that TestMain creates
// and deletes: real garbage collection, namespace lifecycle, TokenRequest and RBAC, and the manager
// binary running as its own ServiceAccount under the generated ClusterRole.
package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/localcluster"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// clusterName is the local cluster's name: QM_E2E_CLUSTER, else qm-e2e (set it to run two e2e runs
// on one machine at once).
var clusterName = cmp.Or(os.Getenv("QM_E2E_CLUSTER"), "qm-e2e")

var (
	cluster    *localcluster.Cluster
	admin      client.Client
	managerBin string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// A fresh cluster each run: leftovers of an interrupted run would collide with fixed names.
	if err := localcluster.Down(clusterName); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: deleting a leftover cluster:", err)
	}
	var err error
	cluster, err = localcluster.Up(clusterName, 2)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting the local cluster:", err)
		return 1
	}
	if os.Getenv("QM_E2E_KEEP_CLUSTER") == "" {
		defer func() {
			if err := localcluster.Down(clusterName); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: deleting the local cluster:", err)
			}
		}()
	}
	admin, err = client.New(cluster.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "qm-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	managerBin = filepath.Join(dir, "quartermaster")
	if err := testenv.GoBuild(managerBin, "./cmd/quartermaster"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if _, err := cluster.Kubectl(context.Background(), "apply", "--server-side", "-k", "config/local"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: installing config/local:", err)
		return 1
	}
	if err := waitForManagerPolicies(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}
