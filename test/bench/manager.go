package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
)

// newManager is a manager for one run of a case: metrics off, the cache's transform the binary's
// (cachemeta.Transform), and controller names free to repeat (a case may start several managers in one process).
// opts carries what the case sets itself (scheme, cache restrictions, logger).
func newManager(cfg *rest.Config, opts ctrl.Options) (ctrl.Manager, error) {
	opts.Cache.DefaultTransform = cachemeta.Transform
	opts.Metrics = metricsserver.Options{BindAddress: "0"}
	opts.Controller = config.Controller{SkipNameValidation: ptr.To(true)}
	return ctrl.New(cfg, opts)
}

// startManager starts mgr and waits for its cache; stop ends it and reports its error.
func startManager(ctx context.Context, mgr ctrl.Manager, name string) (stop func(), err error) {
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s manager: %v\n", name, err)
		}
	}
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		stop()
		return nil, fmt.Errorf("%s: cache did not sync", name)
	}
	return stop, nil
}
