// Command upstream-registry runs a private registry for `make demo`: distribution's registry (in
// memory, htpasswd auth, package internal/testing/upstreamregistry) that pushes a small image to
// itself at start-up, the upstream a RegistryMirror pulls through. It writes what a user needs as
// UPSTREAM_URL, UPSTREAM_HOST, UPSTREAM_USERNAME, UPSTREAM_PASSWORD and IMAGE lines to --env-file
// (mode 0600) once the image is there, and serves until it is stopped.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (port 0 picks a free port)")
	envFile := flag.String("env-file", "", "write the registry's address, credentials and image here (required)")
	user := flag.String("username", "demo", "the one user the registry admits")
	password := flag.String("password", "demo-pull-secret", "that user's password")
	image := flag.String("image", "demo/hello:v1", "repository:tag of the image pushed at start-up")
	flag.Parse()
	if err := run(*listen, *envFile, *user, *password, *image); err != nil {
		fmt.Fprintln(os.Stderr, "upstream-registry:", err)
		os.Exit(1)
	}
}

func run(listen, envFile, user, password, image string) error {
	repo, tag, ok := strings.Cut(image, ":")
	if envFile == "" || !ok || repo == "" || tag == "" {
		return errors.New("--env-file is required and --image must be repository:tag")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "upstream-registry")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	app, err := upstreamregistry.New(ctx, dir, user, password)
	if err != nil {
		return err
	}
	defer func() { _ = app.Shutdown() }()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()

	host := ln.Addr().String()
	url := "http://" + host
	pushCtx, cancel := context.WithTimeout(ctx, time.Minute)
	d, err := upstreamregistry.Pusher{URL: url, User: user, Password: password}.PushImage(pushCtx, repo, tag)
	cancel()
	if err != nil {
		return fmt.Errorf("pushing %s: %w", image, err)
	}
	env := fmt.Sprintf("UPSTREAM_URL=%s\nUPSTREAM_HOST=%s\nUPSTREAM_USERNAME=%s\nUPSTREAM_PASSWORD=%s\nIMAGE=%s/%s\n",
		url, host, user, password, host, image)
	if err := os.WriteFile(envFile+".tmp", []byte(env), 0o600); err != nil {
		return err
	}
	if err := os.Rename(envFile+".tmp", envFile); err != nil {
		return err
	}
	fmt.Printf("registry at %s (user %s) holds %s/%s@%s; connection in %s\n", url, user, host, image, d, envFile)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	return srv.Shutdown(shutdownCtx)
}
