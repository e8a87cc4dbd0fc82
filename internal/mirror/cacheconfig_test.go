package mirror

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
)

var cacheConfigCases = map[string]CacheParams{
	// The usual mirror: Docker Hub, content kept a week after its last pull.
	"docker-hub": {UpstreamURL: "https://registry-1.docker.io", TTL: 168 * time.Hour},
	// A bare host means https; a TTL of zero keeps content forever.
	"keep-forever": {UpstreamURL: "quay.io", TTL: 0},
	// A plain-HTTP upstream with a port and an odd TTL.
	"http-upstream": {UpstreamURL: "http://registry.internal:5000/", TTL: 90 * time.Minute},
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

// The rendered file means to distribution what the cache pod relies on.
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

func TestCacheConfigParsesAsDistributionConfig(t *testing.T) {
	for name, p := range cacheConfigCases {
		t.Run(name, func(t *testing.T) {
			out, err := CacheConfig(p)
			if err != nil {
				t.Fatal(err)
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
