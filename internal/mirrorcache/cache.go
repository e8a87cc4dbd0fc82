// Package mirrorcache runs a registry mirror's pull-through cache: a registry that answers every
// request of the pull API itself (api.go: the /v2/ check and tag lists; front.go: manifests and
// blobs) from its volume (store.go), from one coalesced fill per digest (fill.go), from the other
// replicas of the mirror (peer.go) and from the upstream through its one upstream client
// (remote.go), which authenticates with the credentials read from files at run time and gives them
// only where the one rule of mirror.CredentialsAllowed allows. It starts while the upstream is
// unreachable (and then serves what it holds), counts the upstream's answers, and stops gracefully
// when its context ends. It keeps no process-wide state but its Prometheus metrics, which the
// caches of one process share.
//
// # Configuration
//
// The cache reads the file mirror.CacheConfig renders (mirror.ParseCacheConfig): the keys of
// distribution's registry configuration the controller has always written, and no others. The
// cache embedded distribution until it answered every request itself; the file keeps that format
// and the render its bytes, by choice: during a rolling upgrade (or a rollback) a cache of the
// earlier release restarting against the new Secret, and a cache of this release against the
// earlier Secret, each read a file they know, and the StatefulSet and its config hash do not change.
// The keys distribution alone used (storage.delete, storage.cache) are read and have no effect;
// any other key fails the start. Listen addresses and the storage directory may be overridden
// (Options, the registry-mirror subcommand's flags), and the log by the binary's --zap flags.
//
// # Volume
//
// The store lives in <rootdirectory>/quartermaster (blobs/sha256/<hex>, index.json, tmp/). Beside
// it, <rootdirectory>/docker holds what distribution wrote in releases that stored content through
// it; the tags listed there are still part of a tag list served while the upstream is down, as
// distribution served them (legacy.go).
package mirrorcache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// Options configure a cache.
type Options struct {
	// ConfigPath is the configuration file (mirror.CacheConfig's output).
	ConfigPath string
	// CredentialsDir holds the upstream's username and password files (mirror.UsernameKey,
	// mirror.PasswordKey); without them the upstream is pulled anonymously.
	CredentialsDir string
	// PinsPath is the mirror's pins file (mirror.Pins, its pins ConfigMap mounted): what the
	// cluster runs, never expired or evicted. Read at every look at the volume when it changed; a
	// missing file pins nothing.
	PinsPath string
	// StorageDir, Addr and MetricsAddr, when set, replace the configuration's storage directory
	// and listen addresses (a cache run as a process beside others).
	StorageDir, Addr, MetricsAddr string
	// Listener and MetricsListener, when set, replace the listen addresses (a test binds port 0).
	Listener, MetricsListener net.Listener
	// Log receives the cache's log. Without one the cache logs to stderr at the configuration's
	// log.level and log.formatter, which LogFlags (the binary's --zap flags), when set, override.
	Log      logr.Logger
	LogFlags *zap.Options
	// Peers, when set, make this cache one of the mirror's replicas acting as one cache (peer.go).
	Peers *PeerOptions
	// Report, when set, receives the cache's note of its pins as it changes (report.go): the
	// registry-mirror command notes it on the cache's own Pod, where the controller reads it.
	Report func(context.Context, mirror.CacheReport) error

	// Tests only: the clock ttls count on, and a look at the data path once it serves.
	now     func() time.Time
	started func(*front)
}

// LoadConfig reads the cache's configuration file.
func LoadConfig(path string) (mirror.CacheSettings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return mirror.CacheSettings{}, err
	}
	s, err := mirror.ParseCacheConfig(b)
	if err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// newLogger is the binary's logging (controller-runtime's zap) at the configuration's level and
// format; flags the command line set win (--zap-devel: its own defaults).
func newLogger(cfg mirror.CacheSettings, flags *zap.Options) (logr.Logger, error) {
	var o zap.Options
	if flags != nil {
		o = *flags
	}
	if o.Development {
		return zap.New(zap.UseFlagOptions(&o)), nil
	}
	if o.Level == nil && cfg.LogLevel != "" {
		l, err := zapcore.ParseLevel(cfg.LogLevel)
		if err != nil {
			return logr.Logger{}, fmt.Errorf("log.level: %w", err)
		}
		o.Level = l
	}
	if o.NewEncoder == nil && cfg.LogFormat == "text" {
		zap.ConsoleEncoder()(&o)
	}
	return zap.New(zap.UseFlagOptions(&o)), nil
}

// Run serves the cache until ctx ends, then lets running requests finish for the configuration's
// http.draintimeout. It never contacts the upstream before a request needs it.
func Run(ctx context.Context, opts Options) error {
	cfg, err := LoadConfig(opts.ConfigPath)
	if err != nil {
		return err
	}
	override := func(to *string, given string) {
		if given != "" {
			*to = given
		}
	}
	override(&cfg.StorageDir, opts.StorageDir)
	override(&cfg.Addr, opts.Addr)
	override(&cfg.MetricsAddr, opts.MetricsAddr)
	log := opts.Log
	if log.GetSink() == nil {
		if log, err = newLogger(cfg, opts.LogFlags); err != nil {
			return err
		}
	}
	credsDir, err := filepath.Abs(opts.CredentialsDir)
	if err != nil {
		return err
	}
	registerMetrics()
	root := cfg.StorageDir
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
	rem, err := newRemote(cfg.Upstream, credsDir, log)
	if err != nil {
		return err
	}

	// What a failed start began ends with appCtx.
	appCtx, cancelApp := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelApp()

	ln, err := listen(opts.Listener, cfg.Addr)
	if err != nil {
		return err
	}
	var pc *peers
	if opts.Peers != nil {
		pc = newPeers(*opts.Peers, log)
		if opts.Peers.Lookup != nil {
			// Nothing is served before the first lookup ended: until then this pod knows no other.
			opts.Peers.Set.Watch(appCtx, opts.Peers.Lookup, pc.lookupInterval, pc.lookupTimeout, pc.logPeers, func(err error) {
				log.Error(err, "looking up the cache's peers: keeping the last ones")
			})
		}
	}
	data := newFront(rem, pc, st, cfg.TTL, root, log)
	if cfg.HighWater > 0 { // settings made without ParseCacheConfig keep the defaults
		data.highWater, data.lowWater = cfg.HighWater, cfg.LowWater
	}
	data.pinsPath = opts.PinsPath
	data.loadPins() // before the first sweep: pins are known before anything expires
	if opts.Report != nil {
		data.reporter = newReporter(opts.Report, log)
		data.wg.Go(func() { data.reporter.run(data.ctx) })
	}
	if opts.started != nil {
		opts.started(data) // before anything reads it: a test may replace its volume or clock
	}
	data.loop.Go(data.run)
	defer func() {
		if err := data.close(); err != nil {
			log.Error(err, "writing the cache index")
		}
	}()
	servers := []server{{"addr", newServer(countServed(withHeaders(cfg.Headers, alive(data)))), ln}}
	if opts.Peers != nil {
		pln, err := listen(opts.Peers.Listener, opts.Peers.Addr)
		if err != nil {
			ln.Close()
			return err
		}
		servers = append(servers, server{"peer.addr", newServer(data.servePeers()), pln})
	}
	if cfg.MetricsPath != "" && (opts.MetricsListener != nil || cfg.MetricsAddr != "") {
		mln, err := listen(opts.MetricsListener, cfg.MetricsAddr)
		if err != nil {
			for _, s := range servers {
				s.ln.Close()
			}
			return err
		}
		mux := http.NewServeMux()
		mux.Handle(cfg.MetricsPath, metricsHandler())
		servers = append(servers, server{"metrics.addr", newServer(mux), mln})
	} else if opts.MetricsListener != nil {
		opts.MetricsListener.Close()
	}
	logStart(log, cfg, credsDir, servers)
	return serve(ctx, servers, cfg.DrainTimeout, log)
}

// contentDir is the store's directory in the storage root, beside distribution's "docker".
const contentDir = "quartermaster"

type server struct {
	name string // its address's field in the start's log line
	srv  *http.Server
	ln   net.Listener
}

// serve runs the servers until ctx ends or one fails, then drains them all at once: every port
// refuses new connections from then on, and what each one serves has the whole drain to finish.
func serve(ctx context.Context, servers []server, drain time.Duration, log logr.Logger) error {
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
	log.Info("registry mirror cache stopping", "draintimeout", drain.String())
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

func listen(given net.Listener, addr string) (net.Listener, error) {
	if given != nil {
		return given, nil
	}
	return net.Listen("tcp", addr)
}

func newServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
}

// alive answers LivePath: the process serves HTTP.
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

// withHeaders sets the configuration's http.headers on every answer.
func withHeaders(headers map[string][]string, next http.Handler) http.Handler {
	if len(headers) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range headers {
			w.Header()[http.CanonicalHeaderKey(k)] = v
		}
		next.ServeHTTP(w, r)
	})
}

func logStart(log logr.Logger, cfg mirror.CacheSettings, credsDir string, servers []server) {
	kv := []any{"upstream", cfg.Upstream, "ttl", cfg.TTL.String(), "storage", cfg.StorageDir}
	for _, s := range servers {
		kv = append(kv, s.name, s.ln.Addr().String())
	}
	if _, _, err := readCredentials(credsDir); err != nil {
		kv = append(kv, "credentials", err.Error())
	} else if _, err := os.Stat(filepath.Join(credsDir, mirror.UsernameKey)); err == nil {
		kv = append(kv, "credentials", "from "+credsDir)
	} else {
		kv = append(kv, "credentials", "none: anonymous pulls")
	}
	log.Info("registry mirror cache serving", kv...)
}
