package mirror

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The cache pod's contract: what the StatefulSet mounts and probes, and what the registry-mirror
// subcommand (internal/mirrorcache) reads and serves.
const (
	// CachePort is where the cache serves the registry API to the nodes.
	CachePort = 5000
	// MetricsPort serves Prometheus metrics at MetricsPath.
	MetricsPort = 5001
	MetricsPath = "/metrics"
	// PeerPort serves content by digest to the mirror's other cache pods, which find each other
	// through the SRV records of the headless Service's port named PeerPortName.
	PeerPort     = 5002
	PeerPortName = "peer"
	// StorageDir is the cache's filesystem storage: the pod's volume.
	StorageDir = "/var/lib/registry"
	// ConfigDir is the mounted cache Secret: the configuration (ConfigFile) and, for an upstream
	// that needs them, the credentials (UsernameKey, PasswordKey). Without them the upstream is
	// pulled anonymously.
	ConfigDir   = "/etc/quartermaster/mirror"
	ConfigFile  = "config.yml"
	UsernameKey = "username"
	PasswordKey = "password"
	// LivePath answers 200 on CachePort once the process serves HTTP: a liveness probe.
	LivePath = "/"
	// ReadyPath is the registry API's version check on CachePort (clients such as Docker's check it
	// before a pull; containerd's resolver does not): 200 once the cache serves. It does not depend
	// on the upstream, so a cache keeps serving what it holds while the upstream is down.
	ReadyPath = "/v2/"
	// DrainTimeout is how long a stopping cache lets running pulls finish; the pod's
	// terminationGracePeriodSeconds must be longer (the default 30 s is).
	DrainTimeout = 25 * time.Second
)

// CacheParams is what one mirror's cache configuration says.
type CacheParams struct {
	// UpstreamURL is the registry to cache; NormalizeUpstream's rules apply.
	UpstreamURL string
	// TTL is how long content is kept after it was last pulled through; 0 keeps it forever.
	TTL time.Duration
	// HighWater and LowWater are the volume's eviction marks in percent used (Spec's); zero means
	// the defaults.
	HighWater, LowWater int32
}

// cacheConfig is the cache's configuration file: the keys CacheConfig renders, in the format of
// distribution's registry configuration, which the cache embedded until it answered every request
// itself. The file keeps that format so that a cache of either kind reads a file rendered for the
// other during a rolling upgrade (an old pod restarting against a new Secret, a new pod against an
// old one): the renders are the same bytes. ParseCacheConfig reads these keys and no others.
type cacheConfig struct {
	Version string      `json:"version"`
	Log     cacheLog    `json:"log"`
	Storage cacheStore  `json:"storage"`
	HTTP    cacheHTTP   `json:"http"`
	Proxy   cacheRemote `json:"proxy"`
	// Quartermaster's own settings, which distribution never had. Rendered only when one differs
	// from its default, so that the file of a mirror that sets none is the same bytes as before
	// they existed (and its pods' config hash with it).
	Quartermaster *cacheOwn `json:"quartermaster,omitempty"`
}

type cacheOwn struct {
	Eviction *cacheEviction `json:"eviction,omitempty"`
}

// cacheEviction is the volume's marks, in percent used.
type cacheEviction struct {
	HighWaterPercent int32 `json:"highwaterpercent"`
	LowWaterPercent  int32 `json:"lowwaterpercent"`
}

type cacheLog struct {
	Level     string `json:"level"`
	Formatter string `json:"formatter"`
}

type cacheStore struct {
	Filesystem struct {
		RootDirectory string `json:"rootdirectory"`
	} `json:"filesystem"`
	Delete struct {
		Enabled bool `json:"enabled"`
	} `json:"delete"`
	Cache struct {
		BlobDescriptor string `json:"blobdescriptor"`
	} `json:"cache"`
}

type cacheHTTP struct {
	Addr         string              `json:"addr"`
	DrainTimeout string              `json:"draintimeout"`
	Headers      map[string][]string `json:"headers"`
	Debug        struct {
		Addr       string `json:"addr"`
		Prometheus struct {
			Enabled bool   `json:"enabled"`
			Path    string `json:"path"`
		} `json:"prometheus"`
	} `json:"debug"`
}

// cacheRemote has no username or password: the cache reads the credentials from ConfigDir at
// run time, so the configuration never holds a secret.
type cacheRemote struct {
	RemoteURL string `json:"remoteurl"`
	TTL       string `json:"ttl"`
	// Never rendered: read only to refuse a file that holds credentials.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// CacheConfig renders the configuration of one mirror's cache (ParseCacheConfig reads it).
func CacheConfig(p CacheParams) ([]byte, error) {
	// Checked before NormalizeUpstream, whose errors quote the URL: this one must not.
	raw := p.UpstreamURL
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		return nil, errors.New("the upstream URL carries credentials: put them in the credentials Secret")
	}
	upstream, err := NormalizeUpstream(p.UpstreamURL)
	if err != nil {
		return nil, err
	}
	if p.TTL < 0 {
		return nil, fmt.Errorf("ttl %s is negative", p.TTL)
	}
	high, low := p.HighWater, p.LowWater
	if high == 0 {
		high, low = DefaultHighWater, DefaultLowWater
	}
	if err := CheckMarks(high, low); err != nil {
		return nil, err
	}
	c := cacheConfig{
		Version: "0.1",
		Log:     cacheLog{Level: "info", Formatter: "json"},
		Proxy: cacheRemote{
			RemoteURL: upstream,
			// Always written: a missing ttl reads as 7 days (as distribution read it), 0s as forever.
			TTL: p.TTL.String(),
		},
	}
	if high != DefaultHighWater || low != DefaultLowWater {
		c.Quartermaster = &cacheOwn{Eviction: &cacheEviction{HighWaterPercent: high, LowWaterPercent: low}}
	}
	// A directory per upstream: a volume kept (deletionPolicy Retain) and reused by a mirror of
	// another upstream must not serve the first upstream's tags as the second's.
	c.Storage.Filesystem.RootDirectory = StorageDir + "/" + upstreamDir(upstream)
	// Read and ignored since the cache keeps its own store (expiry deletes without asking it);
	// kept so that the rendered bytes, and with them the pods' config hash, stay the same. The
	// cache refuses DELETE requests whatever it says.
	c.Storage.Delete.Enabled = true
	c.Storage.Cache.BlobDescriptor = "inmemory"
	c.HTTP.Addr = ":" + strconv.Itoa(CachePort)
	c.HTTP.DrainTimeout = DrainTimeout.String()
	c.HTTP.Headers = map[string][]string{"X-Content-Type-Options": {"nosniff"}}
	c.HTTP.Debug.Addr = ":" + strconv.Itoa(MetricsPort)
	c.HTTP.Debug.Prometheus.Enabled = true
	c.HTTP.Debug.Prometheus.Path = MetricsPath
	out, err := yaml.Marshal(c)
	if err != nil {
		return nil, err
	}
	return append([]byte(configHeader), out...), nil
}

// configHeader tells a person reading the Secret where the rest of the cache's settings are.
const configHeader = "# Quartermaster's registry mirror cache (distribution registry configuration).\n" +
	"# Upstream credentials are not here: the cache reads the username and password files next to\n" +
	"# this one. Listen addresses, storage and metrics are fixed by the cache's pod.\n"

// CacheSettings are what the cache does with its configuration file (ParseCacheConfig).
type CacheSettings struct {
	// Upstream is the registry the cache pulls through (proxy.remoteurl).
	Upstream string
	// TTL is how long content is kept after its last pull; 0 keeps it forever (proxy.ttl; a
	// file without one means 7 days, as it did for distribution).
	TTL time.Duration
	// StorageDir is the cache's directory of the volume (storage.filesystem.rootdirectory).
	StorageDir string
	// Addr is where the registry API is served (http.addr); DrainTimeout how long a stopping
	// cache lets running requests finish (http.draintimeout, default DrainTimeout); Headers are
	// set on every answer of the registry port (http.headers).
	Addr         string
	DrainTimeout time.Duration
	Headers      map[string][]string
	// MetricsAddr serves Prometheus metrics at MetricsPath (http.debug.addr, when
	// http.debug.prometheus.enabled); "" serves none.
	MetricsAddr, MetricsPath string
	// LogLevel (debug, info, warn or error) and LogFormat (json or text) of the cache's log.
	LogLevel, LogFormat string
	// HighWater and LowWater are the volume's eviction marks, as fractions of it used
	// (quartermaster.eviction, in percent; default DefaultHighWater and DefaultLowWater).
	HighWater, LowWater float64
}

// defaultFileTTL is a file's TTL when it names none (distribution's default, kept for files
// written by hand).
const defaultFileTTL = 7 * 24 * time.Hour

// ParseCacheConfig reads the configuration file CacheConfig renders. It refuses any key the
// renderer never wrote (distribution's other settings: TLS, auth, notifications, other storage),
// so a file that asks for something the cache does not do fails the start instead of being
// half-obeyed, and it refuses credentials in the file: the cache reads them from the files beside
// it.
func ParseCacheConfig(b []byte) (CacheSettings, error) {
	var c cacheConfig
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return CacheSettings{}, fmt.Errorf("the cache reads only the keys Quartermaster renders: %w", err)
	}
	s := CacheSettings{
		Upstream:    c.Proxy.RemoteURL,
		TTL:         defaultFileTTL,
		StorageDir:  c.Storage.Filesystem.RootDirectory,
		Addr:        c.HTTP.Addr,
		Headers:     c.HTTP.Headers,
		MetricsPath: c.HTTP.Debug.Prometheus.Path,
		LogLevel:    c.Log.Level,
		LogFormat:   c.Log.Formatter,
		HighWater:   DefaultHighWater / 100.0,
		LowWater:    DefaultLowWater / 100.0,
	}
	switch {
	case c.Version != "0.1":
		return s, fmt.Errorf("version %q: want \"0.1\"", c.Version)
	case c.Proxy.RemoteURL == "":
		return s, errors.New("proxy.remoteurl is empty: the cache needs an upstream")
	case c.Proxy.Username != "" || c.Proxy.Password != "":
		return s, errors.New("proxy.username and proxy.password must be unset: the cache reads the credentials from its credentials directory")
	case s.StorageDir == "":
		return s, errors.New("storage.filesystem.rootdirectory is empty: the cache needs a directory")
	}
	if _, err := NormalizeUpstream(c.Proxy.RemoteURL); err != nil {
		return s, fmt.Errorf("proxy.remoteurl: %w", err)
	}
	if c.Proxy.TTL != "" {
		ttl, err := time.ParseDuration(c.Proxy.TTL)
		if err != nil || ttl < 0 {
			return s, fmt.Errorf("proxy.ttl %q is not a duration of 0 or more", c.Proxy.TTL)
		}
		s.TTL = ttl
	}
	if c.Quartermaster != nil && c.Quartermaster.Eviction != nil {
		e := c.Quartermaster.Eviction
		if err := CheckMarks(e.HighWaterPercent, e.LowWaterPercent); err != nil {
			return s, fmt.Errorf("quartermaster.eviction: %w", err)
		}
		s.HighWater, s.LowWater = float64(e.HighWaterPercent)/100, float64(e.LowWaterPercent)/100
	}
	s.DrainTimeout = DrainTimeout
	if c.HTTP.DrainTimeout != "" {
		d, err := time.ParseDuration(c.HTTP.DrainTimeout)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("http.draintimeout %q is not a positive duration", c.HTTP.DrainTimeout)
		}
		s.DrainTimeout = d
	}
	if c.HTTP.Debug.Prometheus.Enabled {
		s.MetricsAddr = c.HTTP.Debug.Addr
		if s.MetricsPath == "" {
			s.MetricsPath = MetricsPath
		}
	}
	switch s.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return s, fmt.Errorf("log.level %q is not debug, info, warn or error", s.LogLevel)
	}
	switch s.LogFormat {
	case "", "json", "text":
	default:
		return s, fmt.Errorf("log.formatter %q is not json or text", s.LogFormat)
	}
	return s, nil
}

// upstreamDir names an upstream's directory in the cache volume: "https_registry-1.docker.io".
func upstreamDir(upstream string) string {
	return strings.NewReplacer("://", "_", ":", "_", "[", "", "]", "").Replace(upstream)
}
