package mirror

import (
	"net/url"
	"testing"
)

func TestCredentialsAllowed(t *testing.T) {
	for _, tc := range []struct {
		upstream, target string
		want             bool
	}{
		// The upstream itself, its default port spelled out or not, any case.
		{"https://registry-1.docker.io", "https://registry-1.docker.io/token", true},
		{"https://registry-1.docker.io", "https://REGISTRY-1.docker.io:443/token", true},
		{"https://ghcr.io", "https://ghcr.io/token", true},
		// A token service of the same registrable domain, over https only.
		{"https://registry-1.docker.io", "https://auth.docker.io/token", true},
		{"https://registry-1.docker.io", "https://auth.docker.io:8443/token", true},
		{"https://registry-1.docker.io", "http://auth.docker.io/token", false},
		{"http://registry.example.com", "https://auth.example.com/token", true},
		{"http://registry.example.com", "http://auth.example.com/token", false},
		{"https://registry.example.com.", "https://auth.example.com/token", true},
		// Never downgraded: the upstream's own host over http when it is https.
		{"https://registry-1.docker.io", "http://registry-1.docker.io/token", false},
		{"http://registry.example.com:5000", "http://registry.example.com:5000/token", true},
		{"http://registry.example.com:5000", "https://registry.example.com:5000/token", true},
		// Other domains, look-alikes and parents of a public suffix.
		{"https://registry-1.docker.io", "https://docker.io.example.com/token", false},
		{"https://registry-1.docker.io", "https://example.com/token", false},
		{"https://example.co.uk", "https://evil.co.uk/token", false},
		{"https://registry.example.co.uk", "https://auth.example.co.uk/token", true},
		{"https://registry.example.co.uk", "https://co.uk/token", false},
		{"https://a.github.io", "https://b.github.io/token", false},
		{"https://a.github.io", "https://auth.a.github.io/token", true},
		{"https://a.github.io", "https://github.io/token", false},
		// Addresses, localhost and one-label names: host and port exactly.
		{"http://127.0.0.1:5000", "http://127.0.0.1:5000/token", true},
		{"http://127.0.0.1:5000", "http://127.0.0.1:5001/token", false},
		{"http://127.0.0.1:5000", "http://127.0.0.1/token", false},
		{"https://10.0.0.1", "https://10.0.0.2/token", false},
		{"https://[fd00::1]:5000", "https://[fd00::1]:5000/token", true},
		{"https://[fd00::1]:5000", "https://[fd00::2]:5000/token", false},
		{"http://localhost:5000", "http://localhost:6000/token", false},
		{"https://localhost", "https://auth.localhost/token", false},
		{"https://registry:5000", "https://auth:5000/token", false},
		{"https://registry.internal", "https://evil.internal/token", false},
		// Nothing to send to.
		{"https://quay.io", "", false},
		{"https://quay.io", "/token", false},
		{"", "https://quay.io/token", false},
		{"https://quay.io", "ftp://quay.io/token", false},
	} {
		target, err := url.Parse(tc.target)
		if err != nil {
			t.Fatal(err)
		}
		if got := CredentialsAllowed(tc.upstream, target); got != tc.want {
			t.Errorf("CredentialsAllowed(%q, %q) = %v, want %v", tc.upstream, tc.target, got, tc.want)
		}
	}
	if CredentialsAllowed("https://quay.io", nil) {
		t.Error("CredentialsAllowed with no target: true")
	}
}

// FuzzCredentialsAllowed: whatever the URLs, credentials never go in clear unless the upstream
// itself is plain http and the target is that very host, and never to a host outside the
// upstream's registrable domain.
func FuzzCredentialsAllowed(f *testing.F) {
	f.Add("https://registry-1.docker.io", "https://auth.docker.io/token")
	f.Add("http://127.0.0.1:5000", "http://127.0.0.1:5000/token")
	f.Add("https://example.co.uk", "https://evil.co.uk/token")
	f.Add("https://a.github.io", "http://a.github.io:80/token")
	f.Fuzz(func(t *testing.T, upstream, target string) {
		u, err := url.Parse(target)
		if err != nil || !CredentialsAllowed(upstream, u) {
			return
		}
		up, err := url.Parse(upstream)
		if err != nil {
			t.Fatalf("allowed with an upstream that is no URL: %q", upstream)
		}
		same := hostPort(up) == hostPort(u)
		if u.Scheme != "https" && (!same || up.Scheme != "http") {
			t.Errorf("CredentialsAllowed(%q, %q): credentials in clear", upstream, target)
		}
		if !same && (registrableDomain(up.Hostname()) == "" || registrableDomain(up.Hostname()) != registrableDomain(u.Hostname())) {
			t.Errorf("CredentialsAllowed(%q, %q): another owner's host", upstream, target)
		}
	})
}
