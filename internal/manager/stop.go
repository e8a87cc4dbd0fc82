package manager

import (
	"context"
	"errors"
)

// StartUntilStopped runs start (a manager's Start) until ctx is done and returns its error, except
// an error that only the stop caused.
//
// controller-runtime's manager, stopped while its controllers still wait for their caches to sync,
// has each waiting source fail with "failed to wait for ... caches to sync" and then picks at random
// between returning that error and returning nil (Start selects on both its context and its error
// channel). Errors that reach it later it only logs ("error received after stop sequence was
// engaged"). A stop the caller asked for is not a failure, so an error returned after ctx is done
// is dropped — unless the runnables overran the grace period, which is a real failure to stop
// (context.DeadlineExceeded in the chain). An error returned while ctx is not done is returned as is.
func StartUntilStopped(ctx context.Context, start func(context.Context) error) error {
	err := start(ctx)
	if ctx.Err() == nil || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
