//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The cluster's namespace controller removes every namespaced kind (44 here) of each deleted
// namespace, ten namespaces at a time, in the order they were deleted: 200 namespaces take it 48 s
// on two idle cores (measured with and without kwokctl's --disable-qps-limits: the API server's
// work, not the controller's rate limit), minutes on busy ones, and a namespace deleted behind them
// waits that long. Some tests leave hundreds when they end (the failover, upgrade and manager-kill
// tests' served requests), and some tests' verdicts wait for a namespace's deletion. So:
//
//   - the namespaces a test leaves (leaveNamespaces) are deleted after it in one batch, in the
//     background (the test's slot and locks are not held for it), one batch at a time, and never
//     while a test waits for a deletion;
//   - a test that waits for a namespace's deletion (awaitDeletion) first waits for the batch being
//     deleted, so its own limit counts only its own namespace's turn.
//
// A batch not gone within batchDeletion fails the run (finishBatches, in TestMain).
var (
	// namespaceQueue: a batch holds it (Lock) while it is deleted; awaitDeletion shares it (RLock).
	namespaceQueue sync.RWMutex
	batches        sync.WaitGroup
	batchMu        sync.Mutex
	batchOf        = map[*testing.T]*[]string{}
	batchFailures  []string
)

// batchDeletion bounds one batch's deletion (hundreds of namespaces on a busy machine).
const batchDeletion = 15 * time.Minute

// leaveNamespaces has the namespaces names deleted after t ends, with every other namespace t
// leaves, in one batch (see above). A name already gone is no error.
func leaveNamespaces(t *testing.T, names ...string) {
	t.Helper()
	batchMu.Lock()
	defer batchMu.Unlock()
	if b, ok := batchOf[t]; ok {
		*b = append(*b, names...)
		return
	}
	b := slices.Clone(names)
	batchOf[t] = &b
	t.Cleanup(func() {
		batchMu.Lock()
		names := *batchOf[t]
		delete(batchOf, t)
		batchMu.Unlock()
		batches.Add(1)
		go deleteBatch(t.Name(), names)
	})
}

// deleteBatch deletes the namespaces names left by the test test and waits until they are gone,
// holding namespaceQueue. It runs after its test: a failure is kept for finishBatches.
func deleteBatch(test string, names []string) {
	defer batches.Done()
	namespaceQueue.Lock()
	defer namespaceQueue.Unlock()
	ctx := context.Background()
	fail := func(format string, args ...any) {
		batchMu.Lock()
		defer batchMu.Unlock()
		batchFailures = append(batchFailures, fmt.Sprintf("the %d namespaces %s left: ", len(names), test)+fmt.Sprintf(format, args...))
	}
	for _, name := range names {
		if err := admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
			fail("deleting %s: %v", name, err)
			return
		}
	}
	var left []string
	// This wait runs after its test, where testenv.PollFor (which fails a test) cannot.
	err := wait.PollUntilContextTimeout(ctx, time.Second, batchDeletion, true, func(context.Context) (bool, error) {
		left = left[:0]
		for _, name := range names {
			if gone, detail := namespaceGone(ctx, name); !gone {
				left = append(left, detail)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		fail("%d not gone after %s: %s", len(left), batchDeletion, strings.Join(left[:min(len(left), 5)], "; "))
	}
}

// finishBatches waits for the batches still being deleted and reports those that failed; it
// returns false when one did.
func finishBatches() bool {
	batches.Wait()
	for _, f := range batchFailures {
		fmt.Fprintln(os.Stderr, "e2e:", f)
	}
	return len(batchFailures) == 0
}

// awaitDeletion waits (up to namespaceDeletion) for cond, which holds once a namespace the test
// deleted (or had deleted) is gone, after any batch being deleted (see above).
func awaitDeletion(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	namespaceQueue.RLock()
	defer namespaceQueue.RUnlock()
	testenv.PollFor(t, what, 100*time.Millisecond, namespaceDeletion, cond)
}

// namespaceGone reports whether the namespace name is gone and, when it is not, what the namespace
// controller says holds it (its phase and the conditions that are True: the kinds and finalizers
// left, a discovery or deletion failure).
func namespaceGone(ctx context.Context, name string) (bool, string) {
	ns := &corev1.Namespace{}
	err := admin.Get(ctx, client.ObjectKey{Name: name}, ns)
	switch {
	case apierrors.IsNotFound(err):
		return true, ""
	case err != nil:
		return false, name + ": " + err.Error()
	}
	detail := fmt.Sprintf("%s %s", name, ns.Status.Phase)
	for _, c := range ns.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			detail += fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	return false, detail
}
