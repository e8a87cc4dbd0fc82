package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/quartermaster-dev/quartermaster/internal/manager"
)

// starter is what Run starts: a manager, or a cache on its own.
type starter interface {
	Start(ctx context.Context) error
}

// Running is a manager (or cache) started in the background by Run.
type Running struct {
	cancel context.CancelFunc
	done   chan error
}

// Run starts s until Stop.
func Run(s starter) *Running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- manager.StartUntilStopped(ctx, s.Start) }()
	return r
}

// Done delivers what Start returned, should it return before Stop: a manager that failed by
// itself. After a receive from it, do not call Stop.
func (r *Running) Done() <-chan error { return r.done }

// Stop cancels it, waits until Start returns, and returns its error: one it failed with before the
// stop, or its runnables overrunning the grace period (see manager.StartUntilStopped). A nil
// Running is stopped already.
func (r *Running) Stop() error {
	if r == nil {
		return nil
	}
	r.cancel()
	err := <-r.done
	if errors.Is(err, context.DeadlineExceeded) {
		// The runnables that overran are still running: say where they are.
		return fmt.Errorf("%w; goroutines still running:\n%s", err, OurGoroutines())
	}
	return err
}

// StartCache runs c alone (its manager is not started) until the test ends, and waits for it to
// sync.
func StartCache(t testing.TB, c cache.Cache) {
	t.Helper()
	r := Run(c)
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	if !c.WaitForCacheSync(context.Background()) {
		t.Fatal("the cache did not sync")
	}
}
