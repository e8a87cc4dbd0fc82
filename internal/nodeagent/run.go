package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// reportRetry is the first wait after a check whose report on the Pod failed; it doubles up to
// Resync. Until the Pod says how the node is configured, the mirror's controller counts the node
// as not configured, so a failed report is not left for a whole Resync.
const reportRetry = time.Second

// Run checks the node at once and then every Resync (sooner, with backoff, while its report on
// the Pod fails), serves the probes on the listener (when
// not nil) until ctx ends, and then runs Shutdown.
func (a *Agent) Run(ctx context.Context, probes net.Listener) error {
	serveErr := make(chan error, 1)
	if probes != nil {
		srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { serveErr <- srv.Serve(probes) }()
		defer srv.Close()
	}
	a.log.Info("starting", "endpoint", a.cfg.Endpoint, "upstream", a.cfg.Upstream, "root", a.cfg.Root,
		"containerdConfig", a.cfg.ContainerdConfig, "resync", a.cfg.Resync)
	retry := wait.Backoff{Duration: reportRetry, Factor: 2, Cap: a.cfg.Resync, Steps: math.MaxInt32}
	next := func() time.Duration {
		a.Sync(ctx)
		if a.unreported() {
			return retry.Step()
		}
		retry.Duration, retry.Steps = reportRetry, math.MaxInt32
		return a.cfg.Resync
	}
	timer := time.NewTimer(next())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			// The signal has cancelled ctx; the last read and the removal get their own time.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
			a.Shutdown(sctx)
			cancel()
			return nil
		case err := <-serveErr:
			if !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving the probes: %w", err)
			}
		case <-timer.C:
			timer.Reset(next())
		}
	}
}

// Handler serves /healthz (the check loop is making progress) and /readyz (the node is
// configured: the file is in place with the current content and containerd reads it).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		// A check stuck on the filesystem or the API server for three intervals is worth a
		// restart.
		stale := time.Since(time.Unix(0, a.lastProgress.Load()))
		if limit := max(3*a.cfg.Resync, time.Minute) + apiTimeout; stale > limit {
			http.Error(w, fmt.Sprintf("no check has finished for %s", stale.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := a.Status()
		if !st.Configured {
			http.Error(w, st.Reason+": "+st.Message, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}
