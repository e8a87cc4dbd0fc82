//go:build e2e

package e2e

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// shared is what one test at a time may use on the cluster: a controller whose managers reconcile
// every namespace's objects (every manager authenticates as quartermaster-manager, and only the
// namespaces controller can be given a requests namespace of its own), or the one Kyverno a
// cluster can run (its namespace, Secrets, Leases and webhook configurations have fixed names).
type shared int

const (
	// iamController: a manager running the iam controller (IAMPolicy, IAMServiceAccount, the
	// iam-config ConfigMaps), against the test's own IAM emulator.
	iamController shared = iota
	// vmgroupsController: a manager running the vmgroups controller, against the test's vcsim.
	vmgroupsController
	// mirrorsController: a manager running the mirrors controller (RegistryMirrors, the mirrors'
	// namespace).
	mirrorsController
	// intentsController: a manager running the intents controller (the intents, bindings,
	// exceptions, and the policies they generate).
	intentsController
	// kyvernoEngine: Kyverno (internal/testing/kyverno), its CRDs and the RBAC aggregated into it.
	kyvernoEngine
	numShared
)

var sharedNames = [numShared]string{"iam", "vmgroups", "mirrors", "intents", "kyverno"}

var (
	sharedLocks [numShared]sync.Mutex
	// running counts the parallel tests between parallel and their end.
	running atomic.Int32
)

// parallel marks t parallel (t.Parallel) and waits until it holds each of needs: the test then
// runs beside every other parallel test, using the cluster under its own names, and beside no
// other test that needs one of the same. Locks are taken in one order (no test waits for another
// that waits for it) and released when the test ends, after its other cleanups (its managers
// stopped, its namespaces gone). It is the first statement of a test. The wait is logged: go
// test's durations include it.
func parallel(t *testing.T, needs ...shared) {
	t.Helper()
	t.Parallel()
	needs = slices.Compact(slices.Sorted(slices.Values(needs)))
	began := time.Now()
	for _, n := range needs {
		sharedLocks[n].Lock()
	}
	running.Add(1)
	t.Cleanup(func() { // the first cleanup: it runs last
		running.Add(-1)
		for i := len(needs) - 1; i >= 0; i-- {
			sharedLocks[needs[i]].Unlock()
		}
	})
	if len(needs) > 0 {
		names := make([]string, len(needs))
		for i, n := range needs {
			names[i] = sharedNames[n]
		}
		t.Logf("waited %s for the %s", time.Since(began).Round(time.Millisecond), strings.Join(names, ", "))
	}
}

// alone marks a test that needs the cluster to itself: it installs or swaps what every test
// shares (the CRDs, config/default's objects) or runs every controller at once. Such a test does
// not call t.Parallel: go test runs the tests that do not, one after another, before it starts
// any parallel one, so it runs with no other test of the package beside it. It is the first
// statement of the test.
func alone(t *testing.T) {
	t.Helper()
	if n := running.Load(); n > 0 {
		t.Fatalf("%d parallel tests are running: a test that needs the cluster alone must not be parallel", n)
	}
}
