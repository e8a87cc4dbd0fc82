package mirrorcache

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
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/distribution/distribution/v3/configuration"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/crypto/bcrypt"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/promtext"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testClient is the tests' own HTTP client, with connections of its own.
var testClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

// Upstream authentication schemes.
const (
	authNone     = ""
	authHtpasswd = "htpasswd" // distribution's own basic authentication
	authToken    = "token"    // the token protocol (Docker Hub's): a bearer challenge naming a realm
)

// upstream is a plain distribution registry, in this process, that the test pushes to and the
// cache pulls from; it records every request it receives.
type upstream struct {
	URL, Host  string
	auth       string
	user, pass string
	// anonymousTokens: the token realm also hands out tokens without credentials, as Docker Hub's.
	anonymousTokens bool
	token           string

	srv      *httptest.Server
	stopOnce sync.Once
	mu       sync.Mutex
	seen     []string
	// fault, when set, may answer a request itself (true) before the registry does.
	fault func(w http.ResponseWriter, r *http.Request) bool
}

// setFault puts a fault in front of the upstream registry (nil removes it).
func (u *upstream) setFault(f func(w http.ResponseWriter, r *http.Request) bool) {
	u.mu.Lock()
	u.fault = f
	u.mu.Unlock()
}

// upstreamUser is the user the upstream knows.
const upstreamUser = "puller"

func startUpstream(t *testing.T, auth, pass string, anonymousTokens bool) *upstream {
	user := upstreamUser
	t.Helper()
	cfg := &configuration.Configuration{Storage: configuration.Storage{"inmemory": configuration.Parameters{}}}
	cfg.HTTP.Secret = "upstream-upload-secret"
	if auth == authHtpasswd {
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "htpasswd")
		if err := os.WriteFile(file, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Auth = configuration.Auth{"htpasswd": configuration.Parameters{"realm": "upstream", "path": file}}
	}
	app := handlers.NewApp(context.Background(), cfg)
	t.Cleanup(func() { _ = app.Shutdown() })

	u := &upstream{auth: auth, user: user, pass: pass, anonymousTokens: anonymousTokens, token: randomHex(16)}
	u.srv = httptest.NewUnstartedServer(u.record(u.tokenFront(app)))
	u.URL = "http://" + u.srv.Listener.Addr().String()
	u.Host = u.srv.Listener.Addr().String()
	u.srv.Start()
	t.Cleanup(u.stop)
	return u
}

// stop takes the upstream down: later connections are refused.
func (u *upstream) stop() { u.stopOnce.Do(u.srv.Close) }

func (u *upstream) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, r.Method+" "+r.URL.Path)
		fault := u.fault
		u.mu.Unlock()
		if fault != nil && fault(w, r) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// requests returns the requests received since the last call.
func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	seen := u.seen
	u.seen = nil
	return seen
}

// tokenFront puts the token protocol in front of the registry when auth is authToken: a 401 with
// a bearer challenge, a realm (/token on the same host) that trades the right basic credentials
// for a token, and the registry behind for requests carrying that token.
func (u *upstream) tokenFront(next http.Handler) http.Handler {
	if u.auth != authToken {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			user, pass, ok := r.BasicAuth()
			if (ok && (user != u.user || pass != u.pass)) || (!ok && !u.anonymousTokens) {
				http.Error(w, `{"details":"incorrect username or password"}`, http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"token":%q,"expires_in":300}`, u.token)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+u.token {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="upstream"`, u.URL+"/token"))
			w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// do sends a request to the upstream with the test's (right) credentials.
// do sends one request as the upstream's own user and returns the answer's headers.
func (u *upstream) do(t *testing.T, method, target, contentType string, body []byte, want int) http.Header {
	t.Helper()
	req, err := http.NewRequest(method, target, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	switch u.auth {
	case authHtpasswd:
		req.SetBasicAuth(u.user, u.pass)
	case authToken:
		req.Header.Set("Authorization", "Bearer "+u.token)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %s: %s %s, want %d", method, target, resp.Status, b, want)
	}
	return resp.Header
}

// testImage is a one-layer OCI image pushed to the upstream.
type testImage struct {
	repo, tag string
	manifest  ocispec.Descriptor
	blobs     []ocispec.Descriptor // the config and the layer
}

// byTag and byDigest are the image's references as a node names them: at the upstream's host.
func (i testImage) byTag(u *upstream) string { return u.Host + "/" + i.repo + ":" + i.tag }
func (i testImage) byDigest(u *upstream) string {
	return u.Host + "/" + i.repo + "@" + i.manifest.Digest.String()
}

// testTag is the tag every test image is pushed with.
const testTag = "v1"

// push builds a small image with random content and pushes it through the registry API, tagged
// testTag.
func (u *upstream) push(t *testing.T, repo string) testImage {
	t.Helper()
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	content := []byte(randomHex(512))
	if err := tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(content); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	zw := gzip.NewWriter(&layer)
	if _, err := zw.Write(layerTar.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	imageConfig, err := json.Marshal(ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layerTar.Bytes())}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return u.pushImage(t, repo, imageConfig, layer.Bytes())
}

// pushImage pushes an image of the given config and layers (opaque bytes: nothing unpacks them),
// tagged testTag; blobs lists the config, then the layers.
func (u *upstream) pushImage(t *testing.T, repo string, imageConfig []byte, layers ...[]byte) testImage {
	t.Helper()
	configDesc := u.pushBlob(t, repo, ocispec.MediaTypeImageConfig, imageConfig)
	blobs := []ocispec.Descriptor{configDesc}
	for _, l := range layers {
		blobs = append(blobs, u.pushBlob(t, repo, ocispec.MediaTypeImageLayerGzip, l))
	}
	manifest, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    blobs[1:],
	})
	if err != nil {
		t.Fatal(err)
	}
	u.do(t, http.MethodPut, u.URL+"/v2/"+repo+"/manifests/"+testTag, ocispec.MediaTypeImageManifest, manifest, http.StatusCreated)
	u.requests() // the pushes are not what a test counts
	return testImage{
		repo: repo, tag: testTag,
		manifest: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(manifest), Size: int64(len(manifest))},
		blobs:    blobs,
	}
}

func (u *upstream) pushBlob(t *testing.T, repo, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	uploads := u.URL + "/v2/" + repo + "/blobs/uploads/"
	h := u.do(t, http.MethodPost, uploads, "", nil, http.StatusAccepted)
	base, err := url.Parse(uploads)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := base.Parse(h.Get("Location")) // the Location may be relative
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromBytes(b)
	q := loc.Query()
	q.Set("digest", d.String())
	loc.RawQuery = q.Encode()
	u.do(t, http.MethodPut, loc.String(), "application/octet-stream", b, http.StatusCreated)
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

// runningCache is a cache started by Run, as the registry-mirror subcommand starts it.
type runningCache struct {
	URL, MetricsURL string
	log             *testenv.LogBuffer
	cancel          context.CancelFunc
	done            chan error
	stopOnce        sync.Once
}

// cacheFiles are the cache pod's files: the rendered configuration, the credentials directory
// and the storage volume.
type cacheFiles struct {
	config, credentials, storage string
}

// newCacheFiles renders the configuration for upstreamURL with mirror.CacheConfig and writes the
// credentials (none when username is empty).
func newCacheFiles(t *testing.T, upstreamURL, username, password string) cacheFiles {
	t.Helper()
	return newCacheFilesTTL(t, upstreamURL, username, password, mirror.DefaultTTL)
}

func newCacheFilesTTL(t *testing.T, upstreamURL, username, password string, ttl time.Duration) cacheFiles {
	t.Helper()
	return newCacheFilesOf(t, mirror.CacheParams{UpstreamURL: upstreamURL, TTL: ttl}, username, password)
}

// newCacheFilesOf is a cache's files for a configuration rendered from p.
func newCacheFilesOf(t *testing.T, p mirror.CacheParams, username, password string) cacheFiles {
	t.Helper()
	dir := t.TempDir()
	f := cacheFiles{config: filepath.Join(dir, mirror.ConfigFile), credentials: filepath.Join(dir, "credentials"), storage: filepath.Join(dir, "storage")}
	conf, err := mirror.CacheConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.config, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(f.credentials, 0o700); err != nil {
		t.Fatal(err)
	}
	if username != "" {
		for name, v := range map[string]string{mirror.UsernameKey: username, mirror.PasswordKey: password} {
			if err := os.WriteFile(filepath.Join(f.credentials, name), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

// startCache runs the cache on loopback ports and waits until its readiness path answers.
func startCache(t *testing.T, f cacheFiles) *runningCache {
	t.Helper()
	return startCacheWith(t, f, Options{})
}

// startCacheWith is startCache with the tests' options (registry port listener, peers, clock,
// data path hook) set.
func startCacheWith(t *testing.T, f cacheFiles, extra Options) *runningCache {
	t.Helper()
	ln, mln := extra.Listener, listenLoopback(t)
	if ln == nil {
		ln = listenLoopback(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &runningCache{
		URL:        "http://" + ln.Addr().String(),
		MetricsURL: "http://" + mln.Addr().String() + mirror.MetricsPath,
		log:        &testenv.LogBuffer{},
		cancel:     cancel,
		done:       make(chan error, 1),
	}
	go func() {
		// The file stays as rendered; the storage is the test's.
		c.done <- Run(ctx, Options{ConfigPath: f.config, CredentialsDir: f.credentials, StorageDir: f.storage, Listener: ln, MetricsListener: mln,
			Log: zap.New(zap.WriteTo(c.log)), Peers: extra.Peers, PinsPath: extra.PinsPath, Report: extra.Report, now: extra.now, started: extra.started})
	}()
	t.Cleanup(func() { c.stop(t) })
	testenv.PollFor(t, "the cache to be ready", 10*time.Millisecond, 20*time.Second, func() (bool, string) {
		select {
		case err := <-c.done:
			t.Fatalf("the cache stopped before it was ready: %v\n%s", err, c.log)
		default:
		}
		return readyz(c.URL), "logs:\n" + c.log.String()
	})
	return c
}

// readyz says whether the cache at url answers its readiness check with 200.
func readyz(url string) bool {
	resp, err := testClient.Get(url + mirror.ReadyPath)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop ends the cache's context and waits for Run to return, which must be without error.
func (c *runningCache) stop(t *testing.T) {
	c.stopOnce.Do(func() {
		c.cancel()
		select {
		case err := <-c.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(mirror.DrainTimeout + 5*time.Second):
			t.Errorf("Run did not return after its context ended")
		}
	})
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// metrics scrapes the cache's metrics endpoint: "name{labels}" → value.
func (c *runningCache) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := testClient.Get(c.MetricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := promtext.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// delta is the change of each named series between two scrapes.
func delta(before, after map[string]float64, names ...string) map[string]float64 {
	d := map[string]float64{}
	for _, n := range names {
		d[n] = after[n] - before[n]
	}
	return d
}

// writeHostsDir writes the node's containerd configuration for the upstream's host: the cache
// first, the upstream as the fallback, as the node agent renders it.
func writeHostsDir(t *testing.T, root string, u *upstream, cacheURL string) {
	t.Helper()
	dir := filepath.Join(root, u.Host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	toml := mirror.HostsTOML(mirror.HostsParams{Mirror: "test", Endpoint: cacheURL, Upstream: u.URL})
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), toml, 0o644); err != nil {
		t.Fatal(err)
	}
}

// pull resolves ref and fetches its manifest, config and layers with containerd's resolver,
// configured from the hosts directory as a node's containerd is, and checks every digest.
func pull(ctx context.Context, hostsDir, ref string) error {
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: config.ConfigureHosts(ctx, config.HostOptions{HostDir: config.HostDirFromRoot(hostsDir)}),
	})
	name, desc, err := resolver.Resolve(ctx, ref)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", ref, err)
	}
	fetcher, err := resolver.Fetcher(ctx, name)
	if err != nil {
		return err
	}
	fetch := func(d ocispec.Descriptor) ([]byte, error) {
		rc, err := fetcher.Fetch(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("fetching %s: %w", d.Digest, err)
		}
		defer rc.Close()
		b, err := io.ReadAll(io.LimitReader(rc, d.Size+1))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", d.Digest, err)
		}
		if int64(len(b)) != d.Size || digest.FromBytes(b) != d.Digest {
			return nil, fmt.Errorf("%s: got %d bytes of digest %s", d.Digest, len(b), digest.FromBytes(b))
		}
		return b, nil
	}
	b, err := fetch(desc)
	if err != nil {
		return err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for _, d := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
		if _, err := fetch(d); err != nil {
			return err
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
