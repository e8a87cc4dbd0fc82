package mirror

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
)

func TestHostsTOMLGolden(t *testing.T) {
	cases := map[string]HostsParams{
		// The usual mirror: Docker Hub through the cache's cluster IP.
		"docker-hub": {Mirror: "docker-hub", Endpoint: "http://10.96.0.12:5000", Upstream: "https://registry-1.docker.io"},
		// A NodePort mirror (127.0.0.1 on every node) with its own dial timeout.
		"node-port": {Mirror: "quay", Endpoint: "http://127.0.0.1:30500", Upstream: "https://quay.io", DialTimeout: 1500 * time.Millisecond},
		// A plain-HTTP upstream with a port, mirrored on an IPv6 cluster IP.
		"http-upstream": {Mirror: "internal", Endpoint: "http://[fd00::12]:5000", Upstream: "http://registry.internal:5000"},
		// An upstream named docker.io still falls back to the host that serves Docker Hub's API.
		"docker-io-alias": {Mirror: "hub", Endpoint: "http://10.96.0.13:5000", Upstream: "https://docker.io"},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			got := HostsTOML(p)
			golden(t, filepath.Join("hosts", name+".toml"), got)
			if owner, ok := HostsFileOwner(got); !ok || owner != p.Mirror {
				t.Errorf("HostsFileOwner = %q, %v; want %q, true", owner, ok, p.Mirror)
			}
		})
	}
}

// Odd characters in a name or URL cannot break the file: it stays TOML with the values intact.
func TestHostsTOMLQuoting(t *testing.T) {
	p := HostsParams{Mirror: "a\nb", Endpoint: `http://x"y\z:5000`, Upstream: "https://up\x01stream"}
	var doc struct {
		Server string                    `toml:"server"`
		Host   map[string]map[string]any `toml:"host"`
	}
	if err := toml.Unmarshal(HostsTOML(p), &doc); err != nil {
		t.Fatalf("not TOML: %v\n%s", err, HostsTOML(p))
	}
	if doc.Server != p.Upstream {
		t.Errorf("server = %q, want %q", doc.Server, p.Upstream)
	}
	if _, ok := doc.Host[p.Endpoint]; !ok {
		t.Errorf("hosts = %v, want the key %q", doc.Host, p.Endpoint)
	}
	if owner, ok := HostsFileOwner(HostsTOML(p)); !ok || owner != "a_b" {
		t.Errorf("HostsFileOwner = %q, %v; want the name with its line break replaced", owner, ok)
	}
}

func TestHostsFileOwner(t *testing.T) {
	for _, tc := range []struct {
		content string
		owner   string
		ok      bool
	}{
		{string(HostsTOML(HostsParams{Mirror: "docker-hub", Endpoint: "http://e", Upstream: "https://u"})), "docker-hub", true},
		{"# Written by quartermaster's node agent for RegistryMirror m; edits are overwritten.", "m", true},
		{"server = \"https://registry-1.docker.io\"\n", "", false},
		{"", "", false},
		// The marker counts only on the first line: a comment copied lower down is someone's edit.
		{"server = \"https://x\"\n# Written by quartermaster's node agent for RegistryMirror m; edits are overwritten.\n", "", false},
		{"# Written by quartermaster's node agent for RegistryMirror ; edits are overwritten.\n", "", false},
		{"# Written by quartermaster's node agent for RegistryMirror m\n", "", false},
		{" # Written by quartermaster's node agent for RegistryMirror m; edits are overwritten.\n", "", false},
	} {
		owner, ok := HostsFileOwner([]byte(tc.content))
		if owner != tc.owner || ok != tc.ok {
			t.Errorf("HostsFileOwner(%q) = %q, %v; want %q, %v", tc.content, owner, ok, tc.owner, tc.ok)
		}
	}
}

func TestMirrorHost(t *testing.T) {
	for _, tc := range []struct {
		upstream, host, err string
	}{
		{upstream: "https://registry-1.docker.io", host: "docker.io"},
		{upstream: "https://index.docker.io/", host: "docker.io"},
		{upstream: "docker.io", host: "docker.io"},
		{upstream: "https://Registry-1.Docker.IO", host: "docker.io"},
		{upstream: "quay.io", host: "quay.io"},
		{upstream: "https://quay.io:443", host: "quay.io"},
		{upstream: "http://registry.internal:80", host: "registry.internal"},
		{upstream: "http://registry.internal:5000", host: "registry.internal:5000"},
		{upstream: "https://registry.internal:5000/", host: "registry.internal:5000"},
		{upstream: "https://ghcr.io", host: "ghcr.io"},
		// Docker Hub is Docker Hub only on its own port.
		{upstream: "https://registry-1.docker.io:5000", host: "registry-1.docker.io:5000"},
		{upstream: "https://registry.internal:99999", err: "not a host name"},
		{upstream: "http://[fd00::1]:5000", err: "not a host name"},
		{upstream: "", err: "no host"},
		{upstream: "ftp://quay.io", err: "scheme"},
		{upstream: "https://quay.io/v2", err: "path"},
		{upstream: "https://user:pw@quay.io", err: "credentials"},
		{upstream: "https://quay.io?x=1", err: "path"},
	} {
		host, err := MirrorHost(tc.upstream)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("MirrorHost(%q) = %q, %v; want an error about %q", tc.upstream, host, err, tc.err)
			}
			continue
		}
		if err != nil || host != tc.host {
			t.Errorf("MirrorHost(%q) = %q, %v; want %q", tc.upstream, host, err, tc.host)
		}
	}
}

func TestShadowingHostDirName(t *testing.T) {
	for host, want := range map[string]string{
		"docker.io":              "",
		"registry.internal:5000": "registry.internal_5000_",
	} {
		if got := ShadowingHostDirName(host); got != want {
			t.Errorf("ShadowingHostDirName(%q) = %q, want %q", host, got, want)
		}
	}
}

// MirrorHost never panics, returns a name fit for a directory and an image reference, and gives
// the same answer for the normalized upstream as for the raw one (the controller and the agent
// may hold either).
func FuzzMirrorHost(f *testing.F) {
	for _, s := range []string{"https://registry-1.docker.io", "quay.io", "http://registry.internal:5000/",
		"https://[fd00::1]:443", "https://a:b@c", "http://%zz", "https://quay.io:443", " docker.io "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, upstream string) {
		host, err := MirrorHost(upstream)
		if err != nil {
			return
		}
		if err := ValidateMirrorHost(host); err != nil {
			t.Fatalf("MirrorHost(%q) = %q: %v", upstream, host, err)
		}
		normalized, err := NormalizeUpstream(upstream)
		if err != nil {
			t.Fatalf("MirrorHost(%q) accepted what NormalizeUpstream refuses: %v", upstream, err)
		}
		if again, err := MirrorHost(normalized); err != nil || again != host {
			t.Fatalf("MirrorHost(%q) = %q but MirrorHost(%q) = %q, %v", upstream, host, normalized, again, err)
		}
	})
}
