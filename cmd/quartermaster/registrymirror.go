package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"

	"github.com/quartermaster-dev/quartermaster/internal/cli"
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
	opts, err := registryMirrorFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	return mirrorcache.Run(ctx, opts)
}

var registryMirrorUsage = cli.Usage{
	Command: "quartermaster registry-mirror",
	About: `Runs a RegistryMirror's pull-through cache (distribution's registry, configured by --config) with
the upstream's credentials read from --credentials-dir. It is the container of the mirror's
StatefulSet; the mirrors controller renders its configuration and flags.`,
	Examples: []string{
		"# What the StatefulSet runs\n" +
			"quartermaster registry-mirror --config=" + filepath.Join(mirror.ConfigDir, mirror.ConfigFile) + " --credentials-dir=" + mirror.ConfigDir,
	},
}

// registryMirrorFlags reads registry-mirror's command line.
func registryMirrorFlags(args []string, out io.Writer) (mirrorcache.Options, error) {
	fs := flag.NewFlagSet("registry-mirror", flag.ContinueOnError)
	fs.SetOutput(out)
	var o mirrorcache.Options
	fs.StringVar(&o.ConfigPath, "config", filepath.Join(mirror.ConfigDir, mirror.ConfigFile), "the cache's distribution registry configuration file")
	fs.StringVar(&o.CredentialsDir, "credentials-dir", mirror.ConfigDir, "directory with the upstream's username and password files; without them the upstream is pulled anonymously")
	rest, err := cli.Parse(fs, registryMirrorUsage, args)
	if err == nil && len(rest) > 0 {
		err = registryMirrorUsage.Errorf("registry-mirror takes no arguments, got %q", rest)
	}
	return o, err
}

// registryMirrorCredentialHelper is distribution's credential helper protocol, not a command for
// people: its one argument is the protocol's action, and it has no flags.
func registryMirrorCredentialHelper(_ context.Context, args []string) error {
	if len(args) > 0 {
		return errors.New("the credential helper takes no arguments")
	}
	return mirrorcache.CredentialHelper(os.Stdin, os.Stdout)
}
