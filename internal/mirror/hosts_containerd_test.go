//go:build linux

package mirror_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// These tests read the rendered file with containerd's own resolver (core/remotes/docker/config,
// the code its CRI plugin calls with config_path), as a node would.

// writeHostsDir lays out <dir>/<host>/hosts.toml as the node agent does and returns dir.
func writeHostsDir(t *testing.T, host string, p mirror.HostsParams) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), mirror.HostsTOML(p), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestContainerdReadsHostsTOML(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		p          mirror.HostsParams
		want       []docker.RegistryHost
	}{
		{
			name: "docker hub",
			host: "docker.io",
			p:    mirror.HostsParams{Mirror: "hub", Endpoint: "http://10.96.0.12:5000", Upstream: "https://registry-1.docker.io"},
			want: []docker.RegistryHost{
				{Scheme: "http", Host: "10.96.0.12:5000", Path: "/v2", Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve},
				{Scheme: "https", Host: "registry-1.docker.io", Path: "/v2", Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve | docker.HostCapabilityPush | docker.HostCapabilityReferrers},
			},
		},
		{
			name: "plain-http upstream with a port",
			host: "registry.internal:5000",
			p:    mirror.HostsParams{Mirror: "internal", Endpoint: "http://127.0.0.1:30500", Upstream: "http://registry.internal:5000"},
			want: []docker.RegistryHost{
				{Scheme: "http", Host: "127.0.0.1:30500", Path: "/v2", Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve},
				{Scheme: "http", Host: "registry.internal:5000", Path: "/v2", Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve | docker.HostCapabilityPush | docker.HostCapabilityReferrers},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeHostsDir(t, tc.host, tc.p)
			hosts, err := config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: config.HostDirFromRoot(dir)})(tc.host)
			if err != nil {
				t.Fatal(err)
			}
			if len(hosts) != len(tc.want) {
				t.Fatalf("containerd resolved %d hosts, want %d: %+v", len(hosts), len(tc.want), hosts)
			}
			for i, want := range tc.want {
				got := hosts[i]
				if got.Scheme != want.Scheme || got.Host != want.Host || got.Path != want.Path || got.Capabilities != want.Capabilities {
					t.Errorf("host %d = %s://%s%s caps %b, want %s://%s%s caps %b", i,
						got.Scheme, got.Host, got.Path, got.Capabilities, want.Scheme, want.Host, want.Path, want.Capabilities)
				}
			}
			// Only the mirror has a dial timeout, so only its client is a copy with its own
			// transport (plain HTTP: no TLS fallback wrapper either).
			if hosts[0].Client == hosts[1].Client {
				t.Error("the mirror shares the upstream's HTTP client: its dial timeout was not applied")
			}
			if _, ok := hosts[0].Client.Transport.(*http.Transport); !ok {
				t.Errorf("the mirror's transport is %T, want a plain *http.Transport (no HTTPS-first fallback)", hosts[0].Client.Transport)
			}
		})
	}
}

// The mirror's dial timeout is the one in the file: a dial to a mirror that never answers fails
// with a dial timeout although the request itself has no deadline.
func TestContainerdAppliesDialTimeout(t *testing.T) {
	endpoint := "http://" + unansweredAddr(t)
	dir := writeHostsDir(t, "docker.io", mirror.HostsParams{Mirror: "hub", Endpoint: endpoint, Upstream: "https://registry-1.docker.io", DialTimeout: 200 * time.Millisecond})
	hosts, err := config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: config.HostDirFromRoot(dir)})("docker.io")
	if err != nil {
		t.Fatal(err)
	}
	// A backstop that cancels (a cancellation is not a timeout) if no dial timeout applies.
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(20*time.Second, cancel).Stop()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/v2/", nil)
	resp, err := hosts[0].Client.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("the request reached a listener that accepts nothing")
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) || opErr.Op != "dial" || !opErr.Timeout() {
		t.Fatalf("got %v, want a dial timeout", err)
	}
}

// With the mirror up, containerd resolves through it; with it unreachable, through the upstream.
func TestContainerdFallsBackToUpstream(t *testing.T) {
	var mirrorHits, upstreamHits atomic.Int32
	mirrorSrv := httptest.NewServer(registryHandler(&mirrorHits))
	defer mirrorSrv.Close()
	upstream := httptest.NewServer(registryHandler(&upstreamHits))
	defer upstream.Close()

	for _, tc := range []struct {
		name               string
		endpoint           string
		mirrorN, upstreamN int32
	}{
		{name: "mirror up", endpoint: mirrorSrv.URL, mirrorN: 1, upstreamN: 0},
		{name: "mirror unreachable", endpoint: "http://" + unansweredAddr(t), mirrorN: 0, upstreamN: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mirrorHits.Store(0)
			upstreamHits.Store(0)
			dir := writeHostsDir(t, "docker.io", mirror.HostsParams{Mirror: "hub", Endpoint: tc.endpoint, Upstream: upstream.URL, DialTimeout: 200 * time.Millisecond})
			resolver := docker.NewResolver(docker.ResolverOptions{
				Hosts: config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: config.HostDirFromRoot(dir)}),
			})
			_, desc, err := resolver.Resolve(context.Background(), "docker.io/library/busybox:latest")
			if err != nil {
				t.Fatal(err)
			}
			if desc.Digest != manifestDigest {
				t.Errorf("resolved %s, want %s", desc.Digest, manifestDigest)
			}
			if mirrorHits.Load() != tc.mirrorN || upstreamHits.Load() != tc.upstreamN {
				t.Errorf("mirror served %d, upstream %d; want %d and %d", mirrorHits.Load(), upstreamHits.Load(), tc.mirrorN, tc.upstreamN)
			}
		})
	}
}

const (
	manifestDigest = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	manifestType   = "application/vnd.oci.image.manifest.v1+json"
)

// registryHandler answers the manifest HEAD a resolve makes, as a registry would, and counts it.
func registryHandler(hits *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodHead || r.URL.Path != "/v2/library/busybox/manifests/latest" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.Header().Set("Content-Type", manifestType)
		w.Header().Set("Docker-Content-Digest", manifestDigest)
		w.Header().Set("Content-Length", "512")
	})
}

// unansweredAddr is a loopback address whose connections never complete: a listener with a
// backlog of zero that never accepts, its one queue slot taken, so the kernel drops further SYNs.
func unansweredAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	filler, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("filling the accept queue: %v", err)
	}
	t.Cleanup(func() { filler.Close() })
	return addr
}
