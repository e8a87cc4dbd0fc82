package mirror

import (
	"bytes"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// DefaultDialTimeout bounds how long containerd waits to connect to the mirror before it falls
// back to the upstream. containerd's own default is 30 s per connection, which a mirror whose
// Service is gone (packets dropped) would add to every pull; an in-cluster connection takes
// milliseconds.
const DefaultDialTimeout = 3 * time.Second

// dockerHubHosts are the names Docker Hub's registry goes by; image references call it docker.io,
// and containerd sends docker.io's pulls to registry-1.docker.io.
var dockerHubHosts = []string{"registry-1.docker.io", "index.docker.io", "docker.io"}

// dockerHubRegistry is where containerd pulls docker.io from when nothing redirects it.
const dockerHubRegistry = "https://registry-1.docker.io"

// HostsParams is what one mirror's hosts.toml says.
type HostsParams struct {
	// Mirror names the RegistryMirror, for the marker line.
	Mirror string
	// Endpoint is the mirror's address, e.g. http://10.96.0.12:5000.
	Endpoint string
	// Upstream is the upstream registry's root as NormalizeUpstream returns it, e.g.
	// https://registry-1.docker.io: containerd falls back to it when the mirror fails.
	Upstream string
	// DialTimeout for the mirror; zero means DefaultDialTimeout.
	DialTimeout time.Duration
}

// markerPrefix starts the first line of every hosts.toml the node agent writes: the agent
// overwrites and removes only files that start with it.
const markerPrefix = "# Written by quartermaster's node agent for RegistryMirror "

const markerSuffix = "; edits are overwritten."

// HostsTOML renders containerd's certs.d/<mirror host>/hosts.toml for one mirror: the mirror
// first, for pulls only, then the upstream as the server, so a mirror that is down or missing an
// image never blocks a pull.
//
// An http:// endpoint needs no TLS setting: containerd speaks plain HTTP to a host whose key says
// http:// unless TLS is configured for it (skip_verify, ca or client would make it try HTTPS
// first), and containerd's CRI sets no default TLS.
func HostsTOML(p HostsParams) []byte {
	timeout := p.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s%s%s\n", markerPrefix, commentSafe(p.Mirror), markerSuffix)
	b.WriteString("# Pulls try the mirror first and fall back to the upstream (server) when it fails.\n")
	fmt.Fprintf(&b, "server = %s\n", tomlString(serverURL(p.Upstream)))
	b.WriteString("\n")
	fmt.Fprintf(&b, "[host.%s]\n", tomlString(p.Endpoint))
	// No push (a pull-through cache refuses it) and no referrers (the cache does not serve the
	// referrers API): containerd sends those to the server.
	b.WriteString("  capabilities = [\"pull\", \"resolve\"]\n")
	fmt.Fprintf(&b, "  dial_timeout = %s\n", tomlString(timeout.String()))
	return b.Bytes()
}

// HostsFileOwner returns the RegistryMirror named in a hosts.toml's marker line, and false when
// the file was not written by the node agent.
func HostsFileOwner(content []byte) (mirror string, ok bool) {
	line, _, _ := bytes.Cut(content, []byte("\n"))
	rest, found := bytes.CutPrefix(line, []byte(markerPrefix))
	if !found {
		return "", false
	}
	name, found := bytes.CutSuffix(rest, []byte(markerSuffix))
	if !found || len(name) == 0 {
		return "", false
	}
	return string(name), true
}

// MirrorHost is the registry host, as image references name it, whose pulls the nodes send to a
// mirror of upstreamURL: docker.io for Docker Hub, otherwise the upstream's host[:port] without
// the scheme's default port (references say quay.io, not quay.io:443).
func MirrorHost(upstreamURL string) (string, error) {
	root, err := NormalizeUpstream(upstreamURL)
	if err != nil {
		return "", err
	}
	u, err := url.Parse(root)
	if err != nil {
		return "", err
	}
	host := u.Host
	if port := u.Port(); (u.Scheme == "https" && port == "443") || (u.Scheme == "http" && port == "80") {
		host = u.Hostname()
	}
	if isDockerHub(host) {
		return "docker.io", nil
	}
	if err := ValidateMirrorHost(host); err != nil {
		return "", fmt.Errorf("upstreamUrl %q: %w", upstreamURL, err)
	}
	return host, nil
}

// mirrorHostPattern is the CRD's rule for mirrorHost: a host name and an optional port, which is
// also a single, harmless directory name under certs.d.
var mirrorHostPattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$`)

// ValidateMirrorHost checks that host is a host name with an optional port, as in image
// references; the node agent makes it a directory name, so nothing else may pass.
func ValidateMirrorHost(host string) error {
	m := mirrorHostPattern.FindStringSubmatch(host)
	if m == nil {
		return fmt.Errorf("mirror host %q is not a host name with an optional port (e.g. docker.io, registry.internal:5000)", host)
	}
	if port := strings.TrimPrefix(m[2], ":"); port != "" {
		if n, _ := strconv.Atoi(port); n < 1 || n > 65535 {
			return fmt.Errorf("mirror host %q is not a host name with an optional port: port %s is out of range", host, port)
		}
	}
	return nil
}

// serverURL is what containerd falls back to: the upstream, with Docker Hub's aliases replaced by
// the host that serves its registry API.
func serverURL(upstream string) string {
	u, err := url.Parse(upstream)
	if err == nil && isDockerHub(u.Hostname()) && u.Scheme == "https" {
		return dockerHubRegistry
	}
	return upstream
}

func isDockerHub(hostname string) bool {
	for _, h := range dockerHubHosts {
		if strings.EqualFold(hostname, h) {
			return true
		}
	}
	return false
}

// ShadowingHostDirName is the certs.d directory name containerd looks up before the host's own
// name for a host with a port: host_port_ for host:port (containerd's hostDirectory). The agent
// writes under the host's name, the form containerd's documentation shows, so a directory of this
// name shadows it. It returns "" for a host without a port.
func ShadowingHostDirName(host string) string {
	i := strings.LastIndex(host, ":")
	if i <= 0 {
		return ""
	}
	return host[:i] + "_" + host[i+1:] + "_"
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// commentSafe keeps a name on the marker line: a line break would end the comment.
func commentSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}
