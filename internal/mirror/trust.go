package mirror

import (
	"net"
	"net/url"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// CredentialsAllowed is the one rule for where a mirror's upstream credentials may go: the
// controller's credentials check and the cache both apply it to the hosts an upstream points
// them at (its token realm). upstream is a registry root as NormalizeUpstream returns it.
//
// Allowed: the upstream's own host and port, never downgraded from https to http; or, over https
// only, a host of the same registrable domain by the public-suffix list (auth.docker.io for
// registry-1.docker.io). A public suffix is no shared owner: example.co.uk and evil.co.uk are
// strangers, and so are a.github.io and b.github.io (github.io is on the list's private part). IP
// addresses, localhost and one-label names have no registrable domain: they match only
// themselves, host and port. (A suffix not on the list, such as .internal, counts as one label.)
func CredentialsAllowed(upstream string, target *url.URL) bool {
	up, err := url.Parse(upstream)
	if err != nil || target == nil || up.Hostname() == "" || target.Hostname() == "" {
		return false
	}
	upScheme, scheme := strings.ToLower(up.Scheme), strings.ToLower(target.Scheme)
	if scheme != "https" && (scheme != "http" || upScheme != "http") {
		return false // never in clear what the upstream receives over TLS
	}
	if hostPort(up) == hostPort(target) {
		return true
	}
	if scheme != "https" {
		return false
	}
	a, b := registrableDomain(up.Hostname()), registrableDomain(target.Hostname())
	return a != "" && a == b
}

// hostPort is u's host name in lower case and its port, the scheme's default when it has none, so
// https://r.example and https://r.example:443 are one host.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[strings.ToLower(u.Scheme)]
	}
	return net.JoinHostPort(strings.TrimSuffix(strings.ToLower(u.Hostname()), "."), port)
}

// registrableDomain is host's public suffix plus one label, or "" when it has none of its own: an
// IP address, localhost, a one-label name or a public suffix itself.
func registrableDomain(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || net.ParseIP(host) != nil {
		return ""
	}
	d, err := publicsuffix.EffectiveTLDPlusOne(host)
	if err != nil {
		return ""
	}
	return d
}
