package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache"
)

func init() {
	subcommands["registry-mirror"] = registryMirror
	// The cache runs this binary as its upstream credential helper (see internal/mirrorcache).
	subcommands[mirrorcache.HelperAction] = registryMirrorCredentialHelper
}

// registryMirror runs a RegistryMirror's pull-through cache (the StatefulSet's container).
func registryMirror(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("registry-mirror", flag.ContinueOnError)
	configPath := fs.String("config", filepath.Join(mirror.ConfigDir, mirror.ConfigFile), "the cache's distribution registry configuration file")
	credsDir := fs.String("credentials-dir", mirror.ConfigDir, "directory with the upstream's username and password files; without them the upstream is pulled anonymously")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("registry-mirror takes no arguments")
	}
	return mirrorcache.Run(ctx, mirrorcache.Options{ConfigPath: *configPath, CredentialsDir: *credsDir})
}

func registryMirrorCredentialHelper(_ context.Context, args []string) error {
	if len(args) > 0 {
		return errors.New("the credential helper takes no arguments")
	}
	return mirrorcache.CredentialHelper(os.Stdin, os.Stdout)
}
