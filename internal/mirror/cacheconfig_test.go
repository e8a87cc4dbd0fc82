package mirror

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"sigs.k8s.io/yaml"
)

var cacheConfigCases = map[string]CacheParams{
	// The usual mirror: Docker Hub, content kept a week after its last pull.
	"docker-hub": {UpstreamURL: "https://registry-1.docker.io", TTL: 168 * time.Hour},
	// A bare host means https; a TTL of zero keeps content forever.
	"keep-forever": {UpstreamURL: "quay.io", TTL: 0},
	// A plain-HTTP upstream with a port and an odd TTL.
	"http-upstream": {UpstreamURL: "http://registry.internal:5000/", TTL: 90 * time.Minute},
	// Eviction marks other than the defaults (the only render with a quartermaster section).
	"eviction-marks": {UpstreamURL: "https://registry.internal", TTL: 168 * time.Hour, HighWater: 70, LowWater: 40},
}

func TestCacheConfigGolden(t *testing.T) {
	for name, p := range cacheConfigCases {
		t.Run(name, func(t *testing.T) {
			got, err := CacheConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, filepath.Join("cacheconfig", name+".yml"), got)
		})
	}
}

// TestUpstreamDirs: each upstream gets its own directory of the volume, a plain name.
func TestUpstreamDirs(t *testing.T) {
	seen := map[string]string{}
	for _, u := range []string{"https://registry-1.docker.io", "http://registry-1.docker.io", "https://quay.io",
		"https://quay.io:8443", "http://[fd00::1]:5000"} {
		d := upstreamDir(u)
		if strings.ContainsAny(d, "/:[]") || d == "" {
			t.Errorf("%s → %q is not a plain directory name", u, d)
		}
		if other, ok := seen[d]; ok {
			t.Errorf("%s and %s share %q", u, other, d)
		}
		seen[d] = u
	}
}

// The rendered file still means to distribution's parser what the cache relies on: a cache of the
// release that embedded distribution, restarting against a file this release renders (a rolling
// upgrade, or a rollback), reads the same settings.
func TestCacheConfigParsesAsDistributionConfig(t *testing.T) {
	for name, p := range cacheConfigCases {
		t.Run(name, func(t *testing.T) {
			out, err := CacheConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			if p.HighWater != 0 {
				// distribution refuses keys it does not know: a file with eviction marks is only
				// ever read by a cache of its own release (a mirror that sets marks was never
				// served by distribution).
				return
			}
			c, err := configuration.Parse(bytes.NewReader(out))
			if err != nil {
				t.Fatalf("configuration.Parse: %v\n%s", err, out)
			}
			upstream, _ := NormalizeUpstream(p.UpstreamURL)
			check := func(what string, got, want any) {
				t.Helper()
				if got != want {
					t.Errorf("%s = %v, want %v", what, got, want)
				}
			}
			check("proxy.remoteurl", c.Proxy.RemoteURL, upstream)
			if c.Proxy.TTL == nil {
				t.Errorf("proxy.ttl is unset: distribution would expire content after 7 days")
			} else {
				check("proxy.ttl", *c.Proxy.TTL, p.TTL)
			}
			check("proxy.username", c.Proxy.Username, "")
			check("proxy.password", c.Proxy.Password, "")
			check("proxy.exec set", c.Proxy.Exec != nil, false)
			check("storage type", c.Storage.Type(), "filesystem")
			check("storage rootdirectory", c.Storage.Parameters()["rootdirectory"], StorageDir+"/"+upstreamDir(upstream))
			check("storage delete.enabled", c.Storage["delete"]["enabled"], true)
			check("storage cache.blobdescriptor", c.Storage["cache"]["blobdescriptor"], "inmemory")
			check("http.addr", c.HTTP.Addr, ":"+strconv.Itoa(CachePort))
			check("http.net", c.HTTP.Net, "")
			check("http.tls.certificate", c.HTTP.TLS.Certificate, "")
			check("http.draintimeout", c.HTTP.DrainTimeout, DrainTimeout)
			check("http.debug.addr", c.HTTP.Debug.Addr, ":"+strconv.Itoa(MetricsPort))
			check("http.debug.prometheus.enabled", c.HTTP.Debug.Prometheus.Enabled, true)
			check("http.debug.prometheus.path", c.HTTP.Debug.Prometheus.Path, MetricsPath)
			check("log.level", string(c.Log.Level), "info")
			check("log.formatter", c.Log.Formatter, "json")
			check("notifications", len(c.Notifications.Endpoints), 0)
			check("auth", c.Auth.Type(), "")
		})
	}
}

func TestCacheConfigRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    CacheParams
		want string
	}{
		{"credentials in the URL", CacheParams{UpstreamURL: "https://user:secret@registry.example"}, "carries credentials"},
		{"credentials in a bare host", CacheParams{UpstreamURL: "user:secret@registry.example"}, "carries credentials"},
		{"a path", CacheParams{UpstreamURL: "https://registry.example/v2/library"}, "has a path"},
		{"another scheme", CacheParams{UpstreamURL: "ftp://registry.example"}, "scheme"},
		{"no host", CacheParams{UpstreamURL: "https://"}, "no host"},
		{"a negative TTL", CacheParams{UpstreamURL: "https://registry.example", TTL: -time.Second}, "negative"},
		{"a high-water mark of 100%", CacheParams{UpstreamURL: "https://registry.example", HighWater: 100, LowWater: 90}, "highWaterPercent 100"},
		{"a low-water mark above the high one", CacheParams{UpstreamURL: "https://registry.example", HighWater: 80, LowWater: 80}, "below eviction.highWaterPercent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := CacheConfig(tc.p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CacheConfig = %q, %v; want an error containing %q", out, err, tc.want)
			}
			if strings.Contains(err.Error(), "secret@") {
				t.Errorf("the error repeats the credentials: %v", err)
			}
		})
	}
}

// The cache reads back what CacheConfig renders: every value it serves with.
func TestParseCacheConfigReadsTheRender(t *testing.T) {
	for name, p := range cacheConfigCases {
		t.Run(name, func(t *testing.T) {
			out, err := CacheConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			s, err := ParseCacheConfig(out)
			if err != nil {
				t.Fatalf("ParseCacheConfig: %v\n%s", err, out)
			}
			upstream, _ := NormalizeUpstream(p.UpstreamURL)
			want := CacheSettings{
				Upstream: upstream, TTL: p.TTL, StorageDir: StorageDir + "/" + upstreamDir(upstream),
				Addr: ":" + strconv.Itoa(CachePort), DrainTimeout: DrainTimeout,
				Headers:     map[string][]string{"X-Content-Type-Options": {"nosniff"}},
				MetricsAddr: ":" + strconv.Itoa(MetricsPort), MetricsPath: MetricsPath,
				LogLevel: "info", LogFormat: "json", HighWater: 0.85, LowWater: 0.75,
			}
			if p.HighWater != 0 {
				want.HighWater, want.LowWater = float64(p.HighWater)/100, float64(p.LowWater)/100
			}
			if !reflect.DeepEqual(s, want) {
				t.Errorf("ParseCacheConfig = %+v\nwant %+v", s, want)
			}
		})
	}
}

// A file with a key the renderer never writes, credentials, or a value the cache cannot use
// fails the start with the key named, instead of being half-obeyed.
func TestParseCacheConfigRefuses(t *testing.T) {
	base, err := CacheConfig(cacheConfigCases["docker-hub"])
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, edit, want string }{
		{"TLS", "http:\n  tls:\n    certificate: /c.pem\n", "tls"},
		{"auth", "auth:\n  htpasswd:\n    realm: x\n", "auth"},
		{"notifications", "notifications:\n  endpoints: []\n", "notifications"},
		{"another storage", "storage:\n  s3:\n    bucket: b\n", "s3"},
		{"credentials", "proxy:\n  remoteurl: https://r.example\n  username: u\n  password: p\n", "credentials directory"},
		{"the exec helper", "proxy:\n  remoteurl: https://r.example\n  exec:\n    command: /bin/helper\n", "exec"},
		{"no upstream", "proxy:\n  ttl: 1h\n", "proxy.remoteurl is empty"},
		{"a bad ttl", "proxy:\n  remoteurl: https://r.example\n  ttl: soon\n", "proxy.ttl"},
		{"a negative ttl", "proxy:\n  remoteurl: https://r.example\n  ttl: -1h\n", "proxy.ttl"},
		{"no storage", "storage:\n  filesystem: {}\n", "rootdirectory is empty"},
		{"a log level", "log:\n  level: chatty\n", "log.level"},
		{"another version", "version: \"0.2\"\n", "version"},
		{"marks the wrong way round", "quartermaster:\n  eviction:\n    highwaterpercent: 50\n    lowwaterpercent: 60\n", "quartermaster.eviction"},
		{"a high-water mark of 0", "quartermaster:\n  eviction:\n    lowwaterpercent: 60\n", "quartermaster.eviction"},
		{"another setting of ours", "quartermaster:\n  prefetch: true\n", "prefetch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := mergeYAML(t, base, tc.edit)
			if _, err := ParseCacheConfig(in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseCacheConfig = %v; want an error containing %q\n%s", err, tc.want, in)
			}
		})
	}
	// Without a ttl a file keeps content 7 days, as distribution read it; 0s keeps it forever.
	s, err := ParseCacheConfig(mergeYAML(t, base, "proxy:\n  remoteurl: https://r.example\n"))
	if err != nil || s.TTL != 7*24*time.Hour {
		t.Errorf("no ttl: %v %v, want 168h", s.TTL, err)
	}
}

// mergeYAML replaces base's top-level sections with edit's.
func mergeYAML(t *testing.T, base []byte, edit string) []byte {
	t.Helper()
	var b, e map[string]any
	if err := yaml.Unmarshal(base, &b); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(edit), &e); err != nil {
		t.Fatal(err)
	}
	maps.Copy(b, e)
	out, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every file an earlier release rendered (testdata/cacheconfig-earlier, named by the commit that
// rendered it; the current render is the golden files) is read by this release's cache: a pod of
// this release may start against a Secret the earlier manager wrote (a rolling upgrade, or an
// upgrade of the image alone).
func TestParseCacheConfigReadsEarlierRenders(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "cacheconfig-earlier", "*.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no earlier renders: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ParseCacheConfig(b)
		if err != nil || s.Upstream == "" || s.StorageDir == "" || s.Addr != ":"+strconv.Itoa(CachePort) || s.MetricsAddr == "" {
			t.Errorf("%s: %+v, %v", f, s, err)
		}
	}
}
