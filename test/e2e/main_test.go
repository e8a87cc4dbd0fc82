//go:build e2e

// Package e2e runs end-to-end tests on a local kwok cluster (hack/cluster.sh) that TestMain creates
// and deletes: real garbage collection, namespace lifecycle, TokenRequest and RBAC, and the manager
// binary running as its own ServiceAccount under the generated ClusterRole.
//
// The tests share the one cluster and run in parallel (go test -parallel N), each under names of
// its own: its namespaces (newNamespace), its requests namespace for the namespaces controller
// (newRequestsNamespace: the controller serves only its --requests-namespace), its cluster-scoped
// objects named after it. What cannot be made a test's own is taken by one test at a time:
//
//   - parallel(t, needs...) is a test's first statement: t.Parallel, then a lock on each
//     controller whose managers it runs other than namespaces (their managers reconcile every
//     namespace's objects: two tests' managers of one controller would serve, and fight over,
//     each other's objects) and on Kyverno (one per cluster), held until the test's cleanups
//     are done. Kyverno sees only the namespaces of the tests that run it
//     (kyverno.OnlyLabelledNamespaces, newKyvernoNamespace), so its webhooks never refuse or slow
//     another test's writes.
//   - alone(t) is the first statement of a test that needs the cluster to itself (the chart and
//     config/default installed and run with every controller, the upgrade that swaps the CRDs):
//     such a test is not parallel, and go test runs those first, one after another, before it
//     starts the parallel ones.
//   - the namespaces a test leaves behind, hundreds for some (its served requests:
//     leaveNamespaces), are deleted after it in one batch, one batch at a time, while no test waits
//     for a namespace's deletion (awaitDeletion): the namespace controller takes deleted
//     namespaces in order, and one deleted behind a batch would wait for all of it
//     (deletions_test.go).
//
// A test asserts about its own objects only, and leaves nothing for another test's manager: the
// objects of its namespaces that a controller holds with a finalizer are gone, served by its own
// managers, before its locks go (deleteNamespace).
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
	// binDir holds what the run builds (the manager, the IAM emulator); deleted at its end.
	binDir string
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
	binDir, err = os.MkdirTemp("", "qm-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	managerBin = filepath.Join(binDir, "quartermaster")
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
	code := m.Run()
	if !finishBatches() && code == 0 {
		code = 1
	}
	return code
}
