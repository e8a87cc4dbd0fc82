package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/cli"
	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache"
	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache/peerset"
	"github.com/quartermaster-dev/quartermaster/internal/ownpod"
)

func init() {
	subcommands["registry-mirror"] = registryMirror
	subcommands["cache-storage"] = cacheStorage
}

var cacheStorageUsage = cli.Usage{
	Command: "quartermaster cache-storage",
	About: `Makes a fresh cache volume writable by the cache's user when its provisioner ignores the Pod's
fsGroup: the init container of a RegistryMirror's StatefulSet, run as root with CAP_CHOWN alone. It
changes the owner of --dir only, and only when the cache cannot write it, it is owned by root and
it is empty; otherwise it says what the cache lacks and fails.`,
	Examples: []string{"# What the StatefulSet's init container runs\nquartermaster cache-storage --dir=" + mirror.StorageDir + " --owner=65532:65532"},
}

// cacheStorage prepares the cache's volume (mirrorcache.PrepareStorage) and leaves what it did as
// its container's termination message.
func cacheStorage(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("cache-storage", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	dir := fs.String("dir", mirror.StorageDir, "the cache's volume")
	owner := fs.String("owner", "65532:65532", "the cache's uid:gid")
	rest, err := cli.Parse(fs, cacheStorageUsage, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err == nil && len(rest) > 0 {
		err = cacheStorageUsage.Errorf("cache-storage takes no arguments, got %q", rest)
	}
	if err != nil {
		return err
	}
	var o mirrorcache.Owner
	if _, err := fmt.Sscanf(*owner, "%d:%d", &o.UID, &o.GID); err != nil || o.UID < 0 || o.GID < 0 {
		return cacheStorageUsage.Errorf("--owner=%q: want UID:GID", *owner)
	}
	done, err := mirrorcache.PrepareStorage(*dir, o)
	if err != nil {
		return err
	}
	if done == "" {
		done = *dir + " is writable by " + *owner + ": nothing to do"
	}
	fmt.Fprintln(os.Stderr, "quartermaster cache-storage:", done)
	leaveTerminationMessage(done)
	return nil
}

// registryMirror runs a RegistryMirror's pull-through cache (the StatefulSet's container).
func registryMirror(ctx context.Context, args []string) error {
	opts, reportToPod, err := registryMirrorFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if reportToPod {
		restCfg, err := config.GetConfig()
		if err != nil {
			return fmt.Errorf("--report-to-pod: connecting to the API server: %w", err)
		}
		restCfg = rest.CopyConfig(restCfg)
		restCfg.UserAgent = "quartermaster-registry-mirror"
		pod, err := ownpod.New(restCfg, os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE"))
		if err != nil {
			return fmt.Errorf("--report-to-pod: %w", err)
		}
		opts.Report = func(ctx context.Context, r mirror.CacheReport) error {
			return pod.Annotate(ctx, map[string]string{mirror.AnnotationCacheReport: r.Annotation()})
		}
	}
	return mirrorcache.Run(ctx, opts)
}

var registryMirrorUsage = cli.Usage{
	Command: "quartermaster registry-mirror",
	About: `Runs a RegistryMirror's pull-through cache: a read-only registry that answers the pull API (the /v2/
check, manifests, blobs, tag lists) from its volume, the mirror's other replicas and the upstream,
configured by --config (the file the mirrors controller renders) with the upstream's credentials
read from --credentials-dir at each use. It is the container of the mirror's StatefulSet; the
mirrors controller renders its configuration and flags. --storage-dir, --address and
--metrics-address replace the file's settings (a cache run as a process beside others); the --zap
flags replace its log settings.`,
	Examples: []string{
		"# What the StatefulSet runs\n" +
			"quartermaster registry-mirror --config=" + filepath.Join(mirror.ConfigDir, mirror.ConfigFile) + " --credentials-dir=" + mirror.ConfigDir +
			" --peers-service=mirror-hub-headless.quartermaster-mirrors.svc --peer-name=$(POD_NAME)",
	},
}

// registryMirrorFlags reads registry-mirror's command line; reportToPod is --report-to-pod.
func registryMirrorFlags(args []string, out io.Writer) (o mirrorcache.Options, reportToPod bool, err error) {
	fs := flag.NewFlagSet("registry-mirror", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.ConfigPath, "config", filepath.Join(mirror.ConfigDir, mirror.ConfigFile), "the cache's configuration file (rendered by the mirrors controller)")
	fs.StringVar(&o.CredentialsDir, "credentials-dir", mirror.ConfigDir, "directory with the upstream's username and password files; without them the upstream is pulled anonymously")
	fs.StringVar(&o.PinsPath, "pins", "", "the mirror's pins file (its pins ConfigMap, mounted; read again when it changes): images in use, never expired or evicted; a missing file pins nothing")
	fs.StringVar(&o.StorageDir, "storage-dir", "", "the cache's storage directory (default: the configuration's)")
	fs.StringVar(&o.Addr, "address", "", "where the registry API listens (default: the configuration's, :"+strconv.Itoa(mirror.CachePort)+")")
	fs.StringVar(&o.MetricsAddr, "metrics-address", "", "where the metrics listen (default: the configuration's, :"+strconv.Itoa(mirror.MetricsPort)+")")
	o.LogFlags = &zap.Options{}
	o.LogFlags.BindFlags(fs)
	service := fs.String("peers-service", "", "the mirror's headless Service (DNS name): its SRV records for the peer port list the other cache pods, which act with this one as one cache")
	list := fs.String("peers", "", "a fixed list of the cache pods acting as one cache, name=host:port,… (instead of --peers-service)")
	name := fs.String("peer-name", "", "this pod's name among the peers (default: the host name, a StatefulSet pod's name)")
	addr := fs.String("peer-address", ":"+strconv.Itoa(mirror.PeerPort), "where the peer port listens (with --peers-service or --peers)")
	fs.BoolVar(&reportToPod, "report-to-pod", false, "note the pins' state (content held, warms running and failed) in an annotation of the cache's own Pod, named by POD_NAME and POD_NAMESPACE, reaching the API server in-cluster or through KUBECONFIG")
	rest, err := cli.Parse(fs, registryMirrorUsage, args)
	if err == nil && len(rest) > 0 {
		err = registryMirrorUsage.Errorf("registry-mirror takes no arguments, got %q", rest)
	}
	if err != nil || (*service == "" && *list == "") {
		return o, reportToPod, err
	}
	if *service != "" && *list != "" {
		return o, reportToPod, registryMirrorUsage.Errorf("--peers-service and --peers exclude each other")
	}
	members, err := peerset.ParseList(*list)
	if err != nil {
		return o, reportToPod, registryMirrorUsage.Errorf("--peers: %v", err)
	}
	if *name == "" {
		if *name, err = os.Hostname(); err != nil {
			return o, reportToPod, err
		}
	}
	o.Peers = &mirrorcache.PeerOptions{Addr: *addr, Set: peerset.New(*name, members)}
	if *service != "" {
		o.Peers.Lookup = peerset.LookupSRV(net.DefaultResolver, mirror.PeerPortName, *service)
	}
	return o, reportToPod, nil
}
