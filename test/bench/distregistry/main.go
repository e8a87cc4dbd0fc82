// Command distregistry runs distribution's registry (v3, the library as shipped: its handlers,
// proxy and filesystem storage, none of Quartermaster's code) from a configuration file: the peer
// the registry cache is measured against in make bench (as a pull-through proxy, and as a plain
// registry serving its own storage).
//
//	distregistry CONFIG
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "distregistry:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return fmt.Errorf("usage: distregistry CONFIG")
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		return err
	}
	cfg, err := configuration.Parse(f)
	f.Close()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	app := handlers.NewApp(ctx, cfg)
	srv := &http.Server{Addr: cfg.HTTP.Addr, Handler: app}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		return err
	}
	return app.Shutdown()
}
