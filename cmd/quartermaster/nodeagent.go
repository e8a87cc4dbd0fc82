package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/nodeagent"
)

func init() {
	subcommands["node-agent"] = nodeAgent
}

// nodeAgent points one node's containerd at one RegistryMirror (the mirror's DaemonSet
// container). It reaches the API server in-cluster, or through KUBECONFIG when run as a process,
// and knows its own Pod from POD_NAME and POD_NAMESPACE (the downward API).
func nodeAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("node-agent", flag.ContinueOnError)
	var cfg nodeagent.Config
	fs.StringVar(&cfg.Mirror, "mirror", "", "name of the RegistryMirror this agent configures nodes for")
	fs.StringVar(&cfg.MirrorHost, "mirror-host", "", "registry host whose pulls go to the mirror, as in image references (docker.io, registry.internal:5000)")
	fs.StringVar(&cfg.Endpoint, "endpoint", "", "address containerd pulls through, e.g. http://10.96.0.12:5000")
	fs.StringVar(&cfg.Upstream, "upstream", "", "upstream registry root containerd falls back to, e.g. https://registry-1.docker.io")
	fs.StringVar(&cfg.Root, "root", "/host", "where the node's filesystem is mounted in the container")
	fs.StringVar(&cfg.ContainerdConfig, "containerd-config", nodeagent.DefaultContainerdConfig, "containerd's configuration file as a path on the node (read under --root)")
	fs.DurationVar(&cfg.Resync, "resync", nodeagent.DefaultResync, "interval between checks of containerd's configuration and the file")
	probeAddr := fs.String("probe-address", ":8081", "address of the /healthz and /readyz endpoints")
	var zopts zap.Options
	zopts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return errors.New("node-agent takes no arguments")
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
	probes, err := net.Listen("tcp", *probeAddr)
	if err != nil {
		return err
	}
	return agent.Run(ctx, probes)
}
