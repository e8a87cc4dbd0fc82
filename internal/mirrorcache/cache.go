// Package mirrorcache runs a registry mirror's pull-through cache: distribution's registry,
// embedded as a library, configured by the file mirror.CacheConfig renders, with the upstream's
// credentials read from files at run time. Unlike distribution's own binary it starts while the
// upstream is unreachable (and then serves what it holds), counts the upstream's answers, and
// stops gracefully when its context ends.
//
// distribution keeps process-wide state (its metrics, logger, http.DefaultTransport): run one
// cache per process at a time.
package mirrorcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the cache's storage
	"github.com/sirupsen/logrus"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// credentialLifetime is how long distribution reuses the helper's answer: rotated credentials
// are in use a minute after the kubelet updates the mounted Secret.
const credentialLifetime = time.Minute

// Options configure a cache.
type Options struct {
	// ConfigPath is the distribution configuration file (mirror.CacheConfig's output).
	ConfigPath string
	// CredentialsDir holds the upstream's username and password files (mirror.UsernameKey,
	// mirror.PasswordKey); without them the upstream is pulled anonymously.
	CredentialsDir string
	// Listener and MetricsListener, when set, replace the configuration's http.addr and
	// http.debug.addr (a test binds port 0).
	Listener, MetricsListener net.Listener
	// LogOutput receives distribution's logs and the cache's; default os.Stderr.
	LogOutput io.Writer
	// Peers, when set, make this cache one of the mirror's replicas acting as one cache (peer.go).
	Peers *PeerOptions

	// Tests only: the clock ttls count on, and a look at the data path once it serves.
	now     func() time.Time
	started func(*front)
}

// Run serves the cache until ctx ends, then lets running requests finish for the configuration's
// http.draintimeout. It never contacts the upstream before a request needs it.
func Run(ctx context.Context, opts Options) error {
	cfg, err := loadConfig(opts.ConfigPath)
	if err != nil {
		return err
	}
	credsDir, err := filepath.Abs(opts.CredentialsDir)
	if err != nil {
		return err
	}
	if err := useCredentialHelper(cfg, credsDir); err != nil {
		return err
	}
	out := opts.LogOutput
	if out == nil {
		out = os.Stderr
	}
	if err := configureLogging(cfg.Log, out); err != nil {
		return err
	}
	setUpProcess()
	root, ttl, err := takeOverContent(cfg)
	if err != nil {
		return err
	}
	// A volume this user cannot write fails the start, saying what it lacks (the container's
	// termination message), rather than every fill at a time.
	vol := root
	for _, err := os.Stat(vol); errors.Is(err, fs.ErrNotExist) && vol != filepath.Dir(vol); _, err = os.Stat(vol) {
		vol = filepath.Dir(vol)
	}
	if err := CheckStorage(vol); err != nil {
		return err
	}
	now := opts.now
	if now == nil {
		now = time.Now
	}
	st, err := openStore(filepath.Join(root, contentDir), now)
	if err != nil {
		return fmt.Errorf("opening the cache's store: %w", err)
	}
	rem, err := newRemote(cfg.Proxy.RemoteURL, credsDir)
	if err != nil {
		return err
	}

	// The cache serves the metrics itself (see countServed).
	serveMetrics := cfg.HTTP.Debug.Prometheus.Enabled
	cfg.HTTP.Debug.Prometheus.Enabled = false

	// The registry outlives ctx by the drain; cancelling appCtx stops what a failed start began.
	appCtx, cancelApp := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelApp()
	app, err := newApp(appCtx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if err := app.Shutdown(); err != nil {
			logrus.WithError(err).Error("stopping the registry")
		}
	}()

	ln, err := listen(opts.Listener, cfg.HTTP.Net, cfg.HTTP.Addr)
	if err != nil {
		return err
	}
	var pc *peers
	if opts.Peers != nil {
		pc = newPeers(*opts.Peers)
		if opts.Peers.Lookup != nil {
			// Nothing is served before the first lookup ended: until then this pod knows no other.
			opts.Peers.Set.Watch(appCtx, opts.Peers.Lookup, pc.lookupInterval, pc.lookupTimeout, logPeers, func(err error) {
				logrus.WithError(err).Warn("looking up the cache's peers: keeping the last ones")
			})
		}
	}
	data := newFront(app, rem, pc, st, ttl)
	go data.run()
	defer func() {
		if err := data.close(); err != nil {
			logrus.WithError(err).Error("writing the cache index")
		}
	}()
	if opts.started != nil {
		opts.started(data)
	}
	servers := []server{{"addr", newServer(countServed(alive(data))), ln}}
	if opts.Peers != nil {
		pln, err := listen(opts.Peers.Listener, "tcp", opts.Peers.Addr)
		if err != nil {
			ln.Close()
			return err
		}
		servers = append(servers, server{"peer.addr", newServer(data.servePeers()), pln})
	}
	if serveMetrics && (opts.MetricsListener != nil || cfg.HTTP.Debug.Addr != "") {
		mln, err := listen(opts.MetricsListener, "tcp", cfg.HTTP.Debug.Addr)
		if err != nil {
			for _, s := range servers {
				s.ln.Close()
			}
			return err
		}
		path := cfg.HTTP.Debug.Prometheus.Path
		if path == "" {
			path = mirror.MetricsPath
		}
		mux := http.NewServeMux()
		mux.Handle(path, metricsHandler())
		servers = append(servers, server{"metrics.addr", newServer(mux), mln})
	} else if opts.MetricsListener != nil {
		opts.MetricsListener.Close()
	}
	logStart(cfg, credsDir, servers)

	drain := cfg.HTTP.DrainTimeout
	if drain <= 0 {
		drain = mirror.DrainTimeout
	}
	return serve(ctx, servers, drain)
}

// contentDir is the data path's directory in the storage root, beside distribution's "docker".
const contentDir = "quartermaster"

// takeOverContent returns the storage root and the ttl, and turns distribution's own expiry off:
// the front serves and expires content (front.go); distribution stores none of it.
func takeOverContent(cfg *configuration.Configuration) (root string, ttl time.Duration, err error) {
	root, _ = cfg.Storage.Parameters()["rootdirectory"].(string)
	if cfg.Storage.Type() != "filesystem" || root == "" {
		return "", 0, errors.New("storage: the cache needs filesystem storage with a rootdirectory")
	}
	ttl = 7 * 24 * time.Hour // distribution's default for a missing ttl
	if cfg.Proxy.TTL != nil {
		ttl = *cfg.Proxy.TTL
	}
	off := time.Duration(0)
	cfg.Proxy.TTL = &off
	return root, ttl, nil
}

// useCredentialHelper makes distribution ask this executable for the upstream's credentials
// (see credhelper.go).
func useCredentialHelper(cfg *configuration.Configuration, credsDir string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the credential helper (this executable): %w", err)
	}
	lifetime := credentialLifetime
	cfg.Proxy.Exec = &configuration.ExecConfig{Command: self, Lifetime: &lifetime}
	// The helper inherits the environment.
	return errors.Join(os.Setenv(envCredentialsDir, credsDir), os.Setenv(envUpstream, cfg.Proxy.RemoteURL))
}

type server struct {
	name string // its address's field in the start's log line
	srv  *http.Server
	ln   net.Listener
}

// serve runs the servers until ctx ends or one fails, then drains them all at once: every port
// refuses new connections from then on, and what each one serves has the whole drain to finish.
func serve(ctx context.Context, servers []server, drain time.Duration) error {
	served := make(chan error, len(servers))
	for _, s := range servers {
		go func() { served <- s.srv.Serve(s.ln) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		err = fmt.Errorf("serving: %w", err)
	}
	logrus.WithField("draintimeout", drain.String()).Info("registry mirror cache stopping")
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	drained := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			if serr := s.srv.Shutdown(shutdownCtx); serr != nil {
				s.srv.Close()
				drained[i] = fmt.Errorf("draining %s: %w", s.name, serr)
			}
		})
	}
	wg.Wait()
	return errors.Join(append([]error{err}, drained...)...)
}

func loadConfig(path string) (*configuration.Configuration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cfg, err := configuration.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case cfg.Proxy.RemoteURL == "":
		return nil, fmt.Errorf("%s: proxy.remoteurl is empty: the cache needs an upstream", path)
	case cfg.Proxy.Username != "" || cfg.Proxy.Password != "" || cfg.Proxy.Exec != nil:
		return nil, fmt.Errorf("%s: proxy.username, proxy.password and proxy.exec must be unset: the cache reads the credentials from its credentials directory", path)
	case cfg.HTTP.TLS.Certificate != "" || cfg.HTTP.TLS.LetsEncrypt.CacheFile != "":
		return nil, fmt.Errorf("%s: http.tls is not supported: the cache serves plain HTTP", path)
	case len(cfg.Notifications.Endpoints) > 0:
		// Notification sinks assume http.DefaultTransport is an *http.Transport (see setUpProcess).
		return nil, fmt.Errorf("%s: notifications are not supported", path)
	}
	return cfg, nil
}

// newApp builds distribution's registry application, which reports bad configuration by
// panicking.
func newApp(ctx context.Context, cfg *configuration.Configuration) (app *handlers.App, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("configuring the registry: %v", r)
		}
	}()
	return handlers.NewApp(ctx, cfg), nil
}

func listen(given net.Listener, network, addr string) (net.Listener, error) {
	if given != nil {
		return given, nil
	}
	if network == "" {
		network = "tcp"
	}
	return net.Listen(network, addr)
}

func newServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
}

// alive answers LivePath itself, as distribution's own server does: the process serves HTTP.
func alive(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == mirror.LivePath {
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// configureLogging sets up logrus, distribution's logger, as its own server does.
func configureLogging(c configuration.Log, out io.Writer) error {
	level := logrus.InfoLevel
	if c.Level != "" {
		l, err := logrus.ParseLevel(string(c.Level))
		if err != nil {
			return fmt.Errorf("log.level: %w", err)
		}
		level = l
	}
	switch c.Formatter {
	case "", "text":
		logrus.SetFormatter(&logrus.TextFormatter{TimestampFormat: time.RFC3339Nano})
	case "json", "logstash":
		logrus.SetFormatter(&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano, DisableHTMLEscape: true})
	default:
		return fmt.Errorf("log.formatter %q is not text or json", c.Formatter)
	}
	logrus.SetLevel(level)
	logrus.SetOutput(out)
	return nil
}

func logStart(cfg *configuration.Configuration, credsDir string, servers []server) {
	fields := logrus.Fields{"upstream": cfg.Proxy.RemoteURL}
	for _, s := range servers {
		fields[s.name] = s.ln.Addr().String()
	}
	if _, _, err := readCredentials(credsDir); err != nil {
		fields["credentials"] = err.Error()
	} else if _, err := os.Stat(filepath.Join(credsDir, mirror.UsernameKey)); err == nil {
		fields["credentials"] = "from " + credsDir
	} else {
		fields["credentials"] = "none: anonymous pulls"
	}
	logrus.WithFields(fields).Info("registry mirror cache serving")
}
