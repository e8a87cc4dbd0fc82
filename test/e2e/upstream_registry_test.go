//go:build e2e

package e2e

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/quartermaster-dev/quartermaster/internal/testing/upstreamregistry"
)

// privateRegistry is a distribution registry in the test process that needs credentials
// (htpasswd): the upstream of a mirror. It can be stopped and started again at the same address,
// keeping its content, and records who asked it for what.
type privateRegistry struct {
	URL, Host  string
	user, pass string
	handler    http.Handler

	mu   sync.Mutex
	srv  *http.Server
	seen []registryRequest
}

// registryRequest is one request the registry received: "GET /v2/…" and the client's User-Agent.
type registryRequest struct{ Request, UserAgent string }

func startPrivateRegistry(t *testing.T, user, pass string) *privateRegistry {
	t.Helper()
	app, err := upstreamregistry.New(context.Background(), t.TempDir(), user, pass)
	must(t, err)
	t.Cleanup(func() { _ = app.Shutdown() })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	r := &privateRegistry{Host: ln.Addr().String(), user: user, pass: pass}
	r.URL = "http://" + r.Host
	r.handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, registryRequest{req.Method + " " + req.URL.Path, req.UserAgent()})
		r.mu.Unlock()
		app.ServeHTTP(w, req)
	})
	r.serve(ln)
	t.Cleanup(r.stop)
	return r
}

func (r *privateRegistry) serve(ln net.Listener) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv = &http.Server{Handler: r.handler}
	go func() { _ = r.srv.Serve(ln) }()
}

// stop takes the registry down: connections are refused until start.
func (r *privateRegistry) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		_ = r.srv.Close()
		r.srv = nil
	}
}

// start serves again at the same address.
func (r *privateRegistry) start(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", r.Host)
	must(t, err)
	r.serve(ln)
}

// requests returns what the registry received since the last call.
func (r *privateRegistry) requests() []registryRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := r.seen
	r.seen = nil
	return seen
}

// blobGETs counts the blob downloads among reqs by clients whose User-Agent starts with agent.
func blobGETs(reqs []registryRequest, agent string) int {
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r.Request, "GET /v2/") && strings.Contains(r.Request, "/blobs/sha256:") && strings.HasPrefix(r.UserAgent, agent) {
			n++
		}
	}
	return n
}

// pushImage pushes a one-layer image for this machine's platform, with random content, as
// repo:tag, and returns its reference at the registry's host.
func (r *privateRegistry) pushImage(t *testing.T, repo, tag string) string {
	t.Helper()
	_, err := upstreamregistry.Pusher{URL: r.URL, User: r.user, Password: r.pass}.PushImage(context.Background(), repo, tag)
	must(t, err)
	r.requests() // the pushes are not what a test counts
	return r.Host + "/" + repo + ":" + tag
}
