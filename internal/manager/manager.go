// Package manager turns command-line arguments into a running controller-runtime manager that hosts
// the chosen Quartermaster controllers. cmd/quartermaster only passes it the arguments and the list
// of controllers.
package manager

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quartermaster-dev/quartermaster/internal/cachemeta"
	"github.com/quartermaster-dev/quartermaster/internal/cli"
	"github.com/quartermaster-dev/quartermaster/internal/codepages"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/memlimit"
)

// The manager's own RBAC: Events for every controller, and the TokenReviews and SubjectAccessReviews
// that guard the metrics endpoint. Leader election uses a namespaced Role (config/rbac).
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Options are the manager's own flags (each controller adds its own).
type Options struct {
	Controllers             string
	LeaderElect             bool
	LeaderElectionID        string
	LeaderElectionNamespace string
	LeaseDuration           time.Duration
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration
	MetricsBindAddress      string
	MetricsSecure           bool
	EnableHTTP2             bool
	HealthProbeBindAddress  string
	PprofBindAddress        string
	KindPollInterval        time.Duration
	Zap                     zap.Options
}

// Leader election defaults. client-go's leader-election checks the Lease every RetryPeriod to
// 2.2×RetryPeriod (jittered); 750ms keeps a graceful handover (the Lease released on stop) under 2 s
// at about 1.3 Lease writes per second from the leader. A crash is taken over after LeaseDuration
// plus up to two retry periods.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 750 * time.Millisecond
)

// validateLease refuses lease settings client-go's leader election would refuse only once elected.
func (o *Options) validateLease() error {
	switch {
	case o.RetryPeriod <= 0:
		return fmt.Errorf("--leader-elect-retry-period must be positive")
	case o.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(o.RetryPeriod)):
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be longer than %.1f × --leader-elect-retry-period (%s)",
			o.RenewDeadline, leaderelection.JitterFactor, o.RetryPeriod)
	case o.LeaseDuration <= o.RenewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration (%s) must be longer than --leader-elect-renew-deadline (%s)",
			o.LeaseDuration, o.RenewDeadline)
	}
	return nil
}

// Scheme returns the scheme with the built-in kinds plus the given API groups.
func Scheme(addToScheme ...func(*runtime.Scheme) error) *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	for _, add := range addToScheme {
		utilruntime.Must(add(s))
	}
	return s
}

// usage is the manager's --help, above its flags.
var usage = cli.Usage{
	Command: "quartermaster",
	About: `Runs the Quartermaster manager: every configured controller (or those --controllers names)
in one controller-runtime manager. The binary's other commands, each with its own help
(quartermaster COMMAND --help): request (a pipeline's namespace request), registry-mirror and
node-agent (the mirrors controller's workloads run them).`,
	Examples: []string{
		"# Run the namespaces and iam controllers against the current kubeconfig's cluster\n" +
			"quartermaster --controllers=namespaces,iam --cluster-name=prod --oidc-issuer=https://oidc.example.com",
		"# Run every configured controller with leader election, as the Deployment does\n" +
			"quartermaster --leader-elect --leader-election-namespace=quartermaster-system --zap-log-level=debug",
	},
}

// ParseFlags parses args into Options and into every controller's own flags (internal/cli: flags
// in any order, --flag=value or --flag value, Go's -flag accepted too).
// flag.ErrHelp is returned for -h/--help, after the usage was written to out.
func ParseFlags(args []string, all []controllers.Controller, out io.Writer) (*Options, error) {
	o := &Options{}
	fs := flag.NewFlagSet("quartermaster", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.Controllers, "controllers", "",
		"Comma-separated controllers to run; empty runs every controller that is configured. Valid: "+
			strings.Join(controllers.Names(all), ", "))
	fs.BoolVar(&o.LeaderElect, "leader-elect", false,
		"Elect a leader through a Lease so only one replica reconciles at a time.")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "quartermaster.quartermaster.dev",
		"Name of the Lease used for leader election.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "",
		"Namespace of the leader election Lease; defaults to the namespace the manager runs in.")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", DefaultLeaseDuration,
		"How long a standby waits, after the leader last renewed, before taking over from a leader that died "+
			"without releasing the Lease (a crash, a lost node): shorter fails over faster, but a leader cut off from the "+
			"API server for that long loses leadership.")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", DefaultRenewDeadline,
		"How long the leader keeps failing to renew before it stops (and exits); must be shorter than the lease duration.")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", DefaultRetryPeriod,
		"How often the leader renews and a standby checks the Lease (a standby waits this to 2.2 times this, jittered): "+
			"a graceful stop hands over within about that, at one Lease write per period from the leader.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "0",
		"Address the metrics endpoint binds to, e.g. :8443 (HTTPS) or :8080 (with --metrics-secure=false); 0 disables it.")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS and allow only callers authorized by the API server (TokenReview + SubjectAccessReview).")
	fs.BoolVar(&o.EnableHTTP2, "enable-http2", false,
		"Allow HTTP/2 on the metrics server (off by default: HTTP/2 Rapid Reset and Stream Cancellation, CVE-2023-44487).")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", ":8081",
		"Address the /healthz and /readyz probes bind to; 0 disables them.")
	fs.StringVar(&o.PprofBindAddress, "pprof-bind-address", "0",
		"Address Go's /debug/pprof endpoints bind to, e.g. 127.0.0.1:6060, to profile CPU and memory; 0 (the default) disables them.")
	fs.DurationVar(&o.KindPollInterval, "crd-poll-interval", controllers.DefaultKindPollInterval,
		"How often a controller whose CustomResourceDefinition is not installed checks for it again.")
	config.RegisterFlags(fs) // --kubeconfig, read by config.GetConfig
	o.Zap.BindFlags(fs)
	for _, c := range all {
		if c.AddFlags != nil {
			c.AddFlags(fs)
		}
	}
	rest, err := cli.Parse(fs, usage, args)
	if err != nil {
		return nil, err
	}
	if len(rest) > 0 {
		return nil, usage.Errorf("unexpected arguments: %q", rest)
	}
	if err := o.validateLease(); err != nil {
		return nil, err
	}
	return o, nil
}

// Run parses args, selects the controllers and runs the manager until ctx ends.
func Run(ctx context.Context, args []string, all []controllers.Controller, scheme *runtime.Scheme, out io.Writer) error {
	o, err := ParseFlags(args, all, out)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	root := zap.New(zap.UseFlagOptions(&o.Zap), zap.WriteTo(out))
	// The global logger can be set only once per process; the manager and the registry are handed
	// root directly so each Run logs where it was told to.
	log.SetLogger(root)
	logger := root.WithName("setup")
	if limit, from, err := memlimit.FromCgroup("/sys/fs/cgroup"); err != nil {
		logger.Info("no soft memory limit from the container's cgroup", "error", err.Error())
	} else if limit > 0 {
		logger.Info("soft memory limit set from the container's limit", "bytes", limit, "ratio", memlimit.Ratio, "from", from)
	}
	logger.V(1).Info("collector growth target", "gogc", memlimit.SetGCPercent())

	sel, err := controllers.Select(o.Controllers, all)
	if err != nil {
		return err
	}
	controllers.LogDisabled(logger, sel)
	cacheOpts, notes := CacheOptions(sel.Enabled)
	for _, note := range notes {
		logger.Info("cache widened", "why", note)
	}

	restConfig, err := config.GetConfig()
	if err != nil {
		return fmt.Errorf("no API server to talk to (use --kubeconfig, KUBECONFIG or run in a cluster): %w", err)
	}
	mgr, err := ctrl.New(restConfig, ctrl.Options{
		Scheme:                        scheme,
		Logger:                        root,
		Cache:                         cacheOpts,
		Metrics:                       metricsOptions(o),
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		PprofBindAddress:              o.PprofBindAddress,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true, // the process exits right after, so a successor need not wait out the lease
		LeaseDuration:                 &o.LeaseDuration,
		RenewDeadline:                 &o.RenewDeadline,
		RetryPeriod:                   &o.RetryPeriod,
		// A standby's controllers start their watches before it leads: on failover its caches are
		// already synced and it reconciles at once, instead of listing everything first.
		Controller: ctrlconfig.Controller{EnableWarmup: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	for _, c := range sel.Enabled {
		if c.Readyz != nil {
			if err := mgr.AddReadyzCheck(c.Name, c.Readyz); err != nil {
				return err
			}
		}
	}

	kinds, err := controllers.NewKinds(mgr, o.KindPollInterval)
	if err != nil {
		return err
	}
	for _, c := range sel.Enabled {
		err := mgr.Add(&controllers.Starter{
			Controller: c,
			Manager:    mgr,
			Kinds:      kinds,
			Log:        root.WithName("registry"),
		})
		if err != nil {
			return err
		}
	}
	logger.Info("starting manager", "controllers", controllers.Names(sel.Enabled))
	releaseStartupPages(logger)
	return StartUntilStopped(ctx, mgr.Start)
}

// CacheOptions is the shared cache of the enabled controllers: their merged restrictions (with a
// note for each widening), every object stored through cachemeta.Transform, and informers without
// the per-namespace index where the controllers mark it unneeded. Tests and benchmarks that run a
// controller in-process build their cache with it too.
func CacheOptions(enabled []controllers.Controller) (cache.Options, []string) {
	byObject, notes := controllers.CacheOptions(enabled)
	return cache.Options{
		ByObject:         byObject,
		DefaultTransform: cachemeta.Transform,
		NewInformer:      controllers.NewInformer(enabled),
	}, notes
}

// releaseStartupPages drops the binary's pages that only start-up used (codepages). A failure
// costs memory, not function, so it is logged and the manager goes on.
func releaseStartupPages(logger logr.Logger) {
	r, err := codepages.Release()
	if err != nil {
		logger.Info("the binary's start-up pages stay resident", "error", err.Error())
		return
	}
	logger.V(1).Info("released the binary's start-up pages", "mappings", r.Ranges,
		"residentFileBytesBefore", r.FileBefore, "residentFileBytesAfter", r.FileAfter)
}

func metricsOptions(o *Options) metricsserver.Options {
	m := metricsserver.Options{
		BindAddress:   o.MetricsBindAddress,
		SecureServing: o.MetricsSecure,
	}
	if o.MetricsSecure {
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	if !o.EnableHTTP2 {
		m.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	return m
}
