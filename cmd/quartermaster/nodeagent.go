package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/cli"
	"github.com/quartermaster-dev/quartermaster/internal/nodeagent"
)

func init() {
	subcommands["node-agent"] = nodeAgent
}

// nodeAgent points one node's containerd at one RegistryMirror (the mirror's DaemonSet
// container). It reaches the API server in-cluster, or through KUBECONFIG when run as a process,
// and knows its own Pod from POD_NAME and POD_NAMESPACE (the downward API).
func nodeAgent(ctx context.Context, args []string) error {
	cfg, zopts, probeAddr, err := nodeAgentFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	cfg.Log = zap.New(zap.UseFlagOptions(&zopts)).WithName("node-agent")

	restCfg, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("connecting to the API server: %w", err)
	}
	restCfg = rest.CopyConfig(restCfg)
	restCfg.UserAgent = "quartermaster-node-agent"
	if cfg.Kube, err = nodeagent.NewKube(restCfg, os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")); err != nil {
		return err
	}
	agent, err := nodeagent.New(cfg)
	if err != nil {
		return err
	}
	probes, err := net.Listen("tcp", probeAddr)
	if err != nil {
		return err
	}
	return agent.Run(ctx, probes)
}

var nodeAgentUsage = cli.Usage{
	Command: "quartermaster node-agent",
	About: `Points one node's containerd at one RegistryMirror: writes the mirror host's hosts.toml under
--root and keeps it right. It is the container of the mirror's DaemonSet (the mirrors controller
renders its flags); it reaches the API server in-cluster or through KUBECONFIG, and knows its own
Pod from POD_NAME and POD_NAMESPACE.`,
	Examples: []string{
		"# What the DaemonSet runs for the RegistryMirror docker-hub\n" +
			"quartermaster node-agent --mirror=docker-hub --mirror-host=docker.io --endpoint=http://10.96.0.12:5000 \\\n" +
			"  --upstream=https://registry-1.docker.io --root=/host",
	},
}

// nodeAgentFlags reads node-agent's command line.
func nodeAgentFlags(args []string, out io.Writer) (cfg nodeagent.Config, zopts zap.Options, probeAddr string, err error) {
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&cfg.Mirror, "mirror", "", "name of the RegistryMirror this agent configures nodes for")
	fs.StringVar(&cfg.MirrorHost, "mirror-host", "", "registry host whose pulls go to the mirror, as in image references (docker.io, registry.internal:5000)")
	fs.StringVar(&cfg.Endpoint, "endpoint", "", "address containerd pulls through, e.g. http://10.96.0.12:5000")
	fs.StringVar(&cfg.Upstream, "upstream", "", "upstream registry root containerd falls back to, e.g. https://registry-1.docker.io")
	fs.StringVar(&cfg.Root, "root", "/host", "where the node's filesystem is mounted in the container")
	fs.StringVar(&cfg.ContainerdConfig, "containerd-config", nodeagent.DefaultContainerdConfig, "containerd's configuration file as a path on the node (read under --root)")
	fs.DurationVar(&cfg.Resync, "resync", nodeagent.DefaultResync, "interval between checks of containerd's configuration and the file")
	fs.StringVar(&probeAddr, "probe-address", ":8081", "address of the /healthz and /readyz endpoints")
	zopts.BindFlags(fs)
	rest, err := cli.Parse(fs, nodeAgentUsage, args)
	if err == nil && len(rest) > 0 {
		err = nodeAgentUsage.Errorf("node-agent takes no arguments, got %q", rest)
	}
	return cfg, zopts, probeAddr, err
}
