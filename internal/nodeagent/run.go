package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Run checks the node at once and then every Resync, serves the probes on the listener (when
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
	a.Sync(ctx)
	ticker := time.NewTicker(a.cfg.Resync)
	defer ticker.Stop()
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
		case <-ticker.C:
			a.Sync(ctx)
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
