//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/crypto/bcrypt"
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
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
	must(t, err)
	htpasswd := filepath.Join(t.TempDir(), "htpasswd")
	must(t, os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600))
	cfg := &configuration.Configuration{Storage: configuration.Storage{"inmemory": configuration.Parameters{}}}
	cfg.HTTP.Secret = "e2e-upload-secret"
	cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "e2e", "path": htpasswd}}
	app := handlers.NewApp(context.Background(), cfg)
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
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	content := make([]byte, 64<<10)
	_, err := rand.Read(content)
	must(t, err)
	must(t, tw.WriteHeader(&tar.Header{Name: "data.bin", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}))
	_, err = tw.Write(content)
	must(t, err)
	must(t, tw.Close())
	var layer bytes.Buffer
	zw := gzip.NewWriter(&layer)
	_, err = zw.Write(layerTar.Bytes())
	must(t, err)
	must(t, zw.Close())
	config, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar.Bytes())}},
		Config:   ocispec.ImageConfig{Labels: map[string]string{"e2e": hex.EncodeToString(content[:8])}},
	})
	must(t, err)
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    r.pushBlob(t, repo, ocispec.MediaTypeImageConfig, config),
		Layers:    []ocispec.Descriptor{r.pushBlob(t, repo, ocispec.MediaTypeImageLayerGzip, layer.Bytes())},
	})
	must(t, err)
	r.do(t, http.MethodPut, r.URL+"/v2/"+repo+"/manifests/"+tag, ocispec.MediaTypeImageManifest, manifest, http.StatusCreated)
	r.requests() // the pushes are not what a test counts
	return r.Host + "/" + repo + ":" + tag
}

func (r *privateRegistry) pushBlob(t *testing.T, repo, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	uploads := r.URL + "/v2/" + repo + "/blobs/uploads/"
	h := r.do(t, http.MethodPost, uploads, "", nil, http.StatusAccepted)
	base, err := url.Parse(uploads)
	must(t, err)
	loc, err := base.Parse(h.Get("Location"))
	must(t, err)
	d := digest.FromBytes(b)
	q := loc.Query()
	q.Set("digest", d.String())
	loc.RawQuery = q.Encode()
	r.do(t, http.MethodPut, loc.String(), "application/octet-stream", b, http.StatusCreated)
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

// do sends one request with the registry's credentials and checks the answer's status.
func (r *privateRegistry) do(t *testing.T, method, target, contentType string, body []byte, want int) http.Header {
	t.Helper()
	req, err := http.NewRequest(method, target, bytes.NewReader(body))
	must(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.SetBasicAuth(r.user, r.pass)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != want {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %s %s, want %d", method, target, resp.Status, b, want)
	}
	return resp.Header
}
