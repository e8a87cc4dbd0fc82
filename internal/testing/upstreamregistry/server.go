package upstreamregistry

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// Server is a private registry (New) served by the test process at an address of its choice: the
// upstream of a mirror. It can be stopped and started again at the same address, keeping its
// content, and records who asked it for what.
type Server struct {
	URL, Host      string
	User, Password string
	handler        http.Handler
	mu             sync.Mutex
	srv            *http.Server
	seen           []Request
	hold           chan struct{} // while open, blob GETs wait (HoldBlobs)
}

// Request is one request the registry answered: "GET /v2/…", the client's User-Agent and the
// answer's status (a 401 is the challenge a client with credentials answers by asking again).
type Request struct {
	Request, UserAgent string
	Status             int
}

// statusRecorder notes the status a handler answers with.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Serve starts a registry that admits only user:password, listening on host (an address of this
// machine, port chosen by the system); it stops when the test ends.
func Serve(t testing.TB, host, user, password string) *Server {
	t.Helper()
	app, err := New(context.Background(), t.TempDir(), user, password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Shutdown() })
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Host: ln.Addr().String(), User: user, Password: password}
	s.URL = "http://" + s.Host
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s.mu.Lock()
		hold := s.hold
		s.mu.Unlock()
		if hold != nil && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			select {
			case <-hold:
			case <-req.Context().Done():
				return
			}
		}
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		app.ServeHTTP(rec, req)
		s.mu.Lock()
		s.seen = append(s.seen, Request{req.Method + " " + req.URL.Path, req.UserAgent(), rec.status})
		s.mu.Unlock()
	})
	s.serve(ln)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = &http.Server{Handler: s.handler}
	go func() { _ = s.srv.Serve(ln) }()
}

// HoldBlobs makes blob GETs wait, from now until the returned release is called: a pull stays in
// flight while a test acts on it.
func (s *Server) HoldBlobs() (release func()) {
	hold := make(chan struct{})
	s.mu.Lock()
	s.hold = hold
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.hold = nil
			s.mu.Unlock()
			close(hold)
		})
	}
}

// Stop takes the registry down: connections are refused until Start.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		_ = s.srv.Close()
		s.srv = nil
	}
}

// Start serves again at the same address.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	ln, err := net.Listen("tcp", s.Host)
	if err != nil {
		t.Fatal(err)
	}
	s.serve(ln)
}

// Requests returns what the registry received since the last call.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := s.seen
	s.seen = nil
	return seen
}

// BlobGETs counts the blob downloads among reqs (answered with content, not a challenge) by
// clients whose User-Agent starts with agent.
func BlobGETs(reqs []Request, agent string) int {
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r.Request, "GET /v2/") && strings.Contains(r.Request, "/blobs/sha256:") && strings.HasPrefix(r.UserAgent, agent) &&
			(r.Status == http.StatusOK || r.Status == http.StatusPartialContent) {
			n++
		}
	}
	return n
}

// PushImage pushes a one-layer image for this machine's platform, with random content, as
// repo:tag, and returns its reference at the registry's host.
func (s *Server) PushImage(t testing.TB, repo, tag string) string {
	t.Helper()
	if _, err := s.Pusher().PushImage(context.Background(), repo, tag); err != nil {
		t.Fatal(err)
	}
	s.Requests() // the pushes are not what a test counts
	return s.Host + "/" + repo + ":" + tag
}

// Pusher pushes to the server with its credentials.
func (s *Server) Pusher() Pusher { return Pusher{URL: s.URL, User: s.User, Password: s.Password} }
