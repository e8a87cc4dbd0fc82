// Command vcenter-sim runs a development vCenter for `make demo`: govmomi's simulator (VPX model,
// HTTPS with a self-signed certificate) with a VM template, until it is stopped. It writes the
// connection as VC_HOST/VC_USER/VC_PASS lines to --env-file (mode 0600), ready for
// `kubectl create secret generic --from-env-file`. (The upstream vcsim and govc commands are not
// available from the Go module proxy; this is the project's own small stand-in.)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/quartermaster-dev/quartermaster/internal/cloud/vsphere/vsimtest"
)

func main() {
	envFile := flag.String("env-file", "", "write VC_HOST, VC_USER and VC_PASS here (required)")
	template := flag.String("template", "ubuntu-22.04-template", "name of the VM template to create")
	flag.Parse()
	if err := run(*envFile, *template); err != nil {
		fmt.Fprintln(os.Stderr, "vcenter-sim:", err)
		os.Exit(1)
	}
}

func run(envFile, template string) error {
	if envFile == "" {
		return fmt.Errorf("--env-file is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sim, err := vsimtest.New(ctx)
	if err != nil {
		return err
	}
	defer sim.Stop()
	// VMware Tools in the guests: VMs report IP addresses, so they become ready.
	if sim.Guests, err = sim.StartGuests(ctx); err != nil {
		return fmt.Errorf("starting the guests: %w", err)
	}
	path, err := sim.CreateTemplate(ctx, template)
	if err != nil {
		return fmt.Errorf("creating the template: %w", err)
	}
	env := fmt.Sprintf("VC_HOST=%s\nVC_USER=%s\nVC_PASS=%s\n", sim.URL.String(), sim.User, sim.Password)
	tmp := envFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(env), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, envFile); err != nil {
		return err
	}
	fmt.Printf("vCenter simulator at %s with template %s; connection in %s\n", sim.URL, path, envFile)
	<-ctx.Done()
	return nil
}
