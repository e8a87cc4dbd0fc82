package manager_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/manager"
)

// The three ways a manager's Start can end, played by fakes: the race itself (a stop during cache
// sync) cannot be triggered on demand.
func TestStartUntilStopped(t *testing.T) {
	failed := errors.New("no RBAC to list widgets")
	cases := []struct {
		name       string
		stopFirst  bool
		start      func(context.Context) error
		wantReturn error
	}{{
		name:      "an error caused by the stop itself is not a failure",
		stopFirst: true,
		start: func(ctx context.Context) error {
			<-ctx.Done()
			return fmt.Errorf("failed to wait for widget caches to sync kind source: *v1.Widget: %w",
				errors.New("failed to get informer from cache: Timeout: failed waiting for *v1.Widget Informer to sync"))
		},
	}, {
		name:      "runnables that overrun the grace period are a failure to stop",
		stopFirst: true,
		start: func(ctx context.Context) error {
			<-ctx.Done()
			return fmt.Errorf("failed waiting for all runnables to end within grace period of 30s: %w", context.DeadlineExceeded)
		},
		wantReturn: context.DeadlineExceeded,
	}, {
		name:       "an error before any stop is returned",
		start:      func(context.Context) error { return failed },
		wantReturn: failed,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.stopFirst {
				cancel()
			}
			err := manager.StartUntilStopped(ctx, tc.start)
			if (tc.wantReturn == nil) != (err == nil) || (tc.wantReturn != nil && !errors.Is(err, tc.wantReturn)) {
				t.Errorf("StartUntilStopped = %v, want %v", err, tc.wantReturn)
			}
		})
	}
}
