// Package upstreamregistry is a private registry for tests and the demo: distribution's registry
// (in memory, htpasswd auth) as an http.Handler, and a client that pushes small one-layer images
// to it. It plays the upstream of a RegistryMirror (test/e2e, cmd/upstream-registry).
package upstreamregistry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd" // the auth it is configured with
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory" // its storage
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/crypto/bcrypt"
)

// Registry is distribution's registry app holding its content in memory and admitting only user
// (htpasswd, realm "upstream"). Serve it with any http.Server; Shutdown releases it.
type Registry struct {
	*handlers.App
}

// New writes an htpasswd file for user and password into dir and returns the registry.
func New(ctx context.Context, dir, user, password string) (*Registry, error) {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		return nil, err
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		return nil, err
	}
	cfg := &configuration.Configuration{Storage: configuration.Storage{"inmemory": configuration.Parameters{}}}
	cfg.HTTP.Secret = "upstream-upload-secret"
	cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "upstream", "path": htpasswd}}
	return &Registry{App: handlers.NewApp(ctx, cfg)}, nil
}

// Pusher pushes images to the registry at URL (http://host:port) with basic credentials.
type Pusher struct {
	URL, User, Password string
	Client              *http.Client
}

// PushImage pushes a one-layer image for this machine's platform as repo:tag, its layer 64 KiB
// of random data (so every push is a new image), and returns its digest.
func (p Pusher) PushImage(ctx context.Context, repo, tag string) (digest.Digest, error) {
	return p.PushRunnable(ctx, repo, tag, nil, "")
}

// PushRunnable pushes an image a container can run: PushImage's layer with program added at
// entrypoint (mode 0755), which the image's config runs. A nil program pushes PushImage's image.
func (p Pusher) PushRunnable(ctx context.Context, repo, tag string, program []byte, entrypoint string) (digest.Digest, error) {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	content := make([]byte, 64<<10)
	if _, err := rand.Read(content); err != nil {
		return "", err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "data.bin", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(content); err != nil {
		return "", err
	}
	var run ocispec.ImageConfig
	if program != nil {
		if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(entrypoint, "/"), Mode: 0o755, Size: int64(len(program)), Typeflag: tar.TypeReg}); err != nil {
			return "", err
		}
		if _, err := tw.Write(program); err != nil {
			return "", err
		}
		run.Entrypoint = []string{entrypoint}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	var layer bytes.Buffer
	zw := gzip.NewWriter(&layer)
	if _, err := zw.Write(layerTar.Bytes()); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	run.Labels = map[string]string{"content": hex.EncodeToString(content[:8])}
	config, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar.Bytes())}},
		Config:   run,
	})
	if err != nil {
		return "", err
	}
	configDesc, err := p.pushBlob(ctx, repo, ocispec.MediaTypeImageConfig, config)
	if err != nil {
		return "", err
	}
	layerDesc, err := p.pushBlob(ctx, repo, ocispec.MediaTypeImageLayerGzip, layer.Bytes())
	if err != nil {
		return "", err
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    []ocispec.Descriptor{layerDesc},
	})
	if err != nil {
		return "", err
	}
	if _, err := p.do(ctx, http.MethodPut, p.URL+"/v2/"+repo+"/manifests/"+tag, ocispec.MediaTypeImageManifest, manifest, http.StatusCreated); err != nil {
		return "", err
	}
	return digest.FromBytes(manifest), nil
}

func (p Pusher) pushBlob(ctx context.Context, repo, mediaType string, b []byte) (ocispec.Descriptor, error) {
	uploads := p.URL + "/v2/" + repo + "/blobs/uploads/"
	h, err := p.do(ctx, http.MethodPost, uploads, "", nil, http.StatusAccepted)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	base, err := url.Parse(uploads)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	loc, err := base.Parse(h.Get("Location"))
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	d := digest.FromBytes(b)
	q := loc.Query()
	q.Set("digest", d.String())
	loc.RawQuery = q.Encode()
	if _, err := p.do(ctx, http.MethodPut, loc.String(), "application/octet-stream", b, http.StatusCreated); err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}, nil
}

// do sends one request with the credentials and checks the answer's status.
func (p Pusher) do(ctx context.Context, method, target, contentType string, body []byte, want int) (http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.SetBasicAuth(p.User, p.Password)
	c := p.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s %s: %s %s, want %d", method, target, resp.Status, b, want)
	}
	return resp.Header, nil
}
