package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the paced upstream's storage
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The registry cache's data path (docs/mirrors.md, Performance): an upstream paced to
// cacheUpstreamRate, an image of cacheLayers incompressible layers, cacheColdPullers pulling it
// at once through one cold cache, then cacheWarmPullers pulling it from a warm one. Peers in the
// same run: distribution's proxy as shipped (cold), and distribution serving the same blobs from
// its own filesystem storage (warm).
const (
	cacheUpstreamRate = 50 << 20 // bytes/s
	cacheLayers       = 4
	cacheLayerBytes   = 16 << 20
	cacheColdPullers  = 50
	cacheWarmPullers  = 16
	cacheRepo         = "bench/app"
	cacheTag          = "v1"
)

// cacheBench is what the cache cases start from: a work folder, the quartermaster binary, the
// paced upstream holding the bench image, and the floor's first part, one client pulling
// straight from the upstream.
type cacheBench struct {
	work, bin string
	up        *pacedUpstream
	img       *benchImage
	direct    time.Duration
}

func startCacheBench(ctx context.Context) (*cacheBench, error) {
	b := &cacheBench{}
	var err error
	if b.work, err = os.MkdirTemp("", "qm-bench-cache"); err != nil {
		return nil, err
	}
	if b.bin, err = managerBinary(); err == nil {
		b.up, err = startPacedUpstream(filepath.Join(b.work, "upstream"))
	}
	if err == nil {
		b.img, err = pushBenchImage(b.up.url, cacheRepo)
	}
	if err == nil {
		if b.direct, err = pullers(ctx, 1, b.up.url, b.img); err != nil {
			err = fmt.Errorf("pulling from the upstream: %w", err)
		}
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *cacheBench) close() {
	if b.up != nil {
		b.up.close()
	}
	os.RemoveAll(b.work)
}

func cacheDataPathBench(ctx context.Context, _ *env) ([]result, error) {
	b, err := startCacheBench(ctx)
	if err != nil {
		return nil, err
	}
	defer b.close()
	work, qm, up, img, direct := b.work, b.bin, b.up, b.img, b.direct
	dist := filepath.Join(binDir, "distregistry")
	if err := testenv.GoBuild(dist, "./test/bench/distregistry"); err != nil {
		return nil, err
	}

	// The cache, cold: 50 pullers at once.
	ours, err := startCacheProcess(qm, up.url, filepath.Join(work, "ours"))
	if err != nil {
		return nil, err
	}
	defer ours.stop()
	up.bytes.Store(0)
	oursCold, err := pullers(ctx, cacheColdPullers, ours.url, img)
	if err != nil {
		return nil, fmt.Errorf("cold pulls through the cache: %w\n%s", err, ours.logs.Tail(4000))
	}
	oursBytes := up.bytes.Load()
	oursColdRSS := ours.memory()
	coalescedN := ours.metric("quartermaster_mirror_coalesced_requests_total{type=\"blob\"}")
	// Floor, part two: the same pullers served by the warm cache.
	warm50, err := pullers(ctx, cacheColdPullers, ours.url, img)
	if err != nil {
		return nil, err
	}
	floor := max(direct, warm50)

	// distribution's proxy as shipped, cold, the same pullers.
	proxy, err := startDistribution(dist, filepath.Join(work, "proxy"), up.url)
	if err != nil {
		return nil, err
	}
	defer proxy.stop()
	up.bytes.Store(0)
	proxyCold, err := pullers(ctx, cacheColdPullers, proxy.url, img)
	if err != nil {
		return nil, fmt.Errorf("cold pulls through distribution's proxy: %w", err)
	}
	proxyBytes := up.bytes.Load()
	proxyRSS := proxy.memory()
	proxy.stop()

	// Warm: 16 pullers from the cache, and from distribution serving its own storage (the image
	// pushed to it), alternately, best of three each.
	plain, err := startDistribution(dist, filepath.Join(work, "plain"), "")
	if err != nil {
		return nil, err
	}
	defer plain.stop()
	if err := pushContent(plain.url, img); err != nil {
		return nil, err
	}
	var oursWarm, plainWarm time.Duration
	for range 3 {
		o, err := pullers(ctx, cacheWarmPullers, ours.url, img)
		if err != nil {
			return nil, err
		}
		p, err := pullers(ctx, cacheWarmPullers, plain.url, img)
		if err != nil {
			return nil, err
		}
		if oursWarm == 0 || o < oursWarm {
			oursWarm = o
		}
		if plainWarm == 0 || p < plainWarm {
			plainWarm = p
		}
	}
	oursWarmRSS, plainRSS := ours.memory(), plain.memory()

	size := float64(img.size)
	warmBytes := float64(cacheWarmPullers) * size
	return []result{
		{metric: fmt.Sprintf("upstream bytes / image, %d pullers of a cold cache (%d MiB image, %d layers, upstream %d MB/s)", cacheColdPullers, img.size>>20, cacheLayers, cacheUpstreamRate>>20),
			value: float64(oursBytes) / size, unit: "x", note: fmt.Sprintf("%.3fx, must be <= 1.05; distribution's proxy: %.2fx; %.0f blob requests coalesced", float64(oursBytes)/size, float64(proxyBytes)/size, coalescedN)},
		{metric: fmt.Sprintf("last of %d cold pullers done", cacheColdPullers), value: oursCold.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the floor %.2f s (must be <= 1.3; one client from the upstream %.2f s, %d pullers of the warm cache %.2f s); distribution's proxy %.2f s",
				oursCold.Seconds()/floor.Seconds(), floor.Seconds(), direct.Seconds(), cacheColdPullers, warm50.Seconds(), proxyCold.Seconds())},
		{metric: fmt.Sprintf("%d pullers of the warm cache", cacheWarmPullers), value: warmBytes / oursWarm.Seconds() / (1 << 20), unit: "MiB/s",
			note: fmt.Sprintf("%.2fx distribution serving its own storage (%.0f MiB/s; must be >= 0.9)", plainWarm.Seconds()/oursWarm.Seconds(), warmBytes/plainWarm.Seconds()/(1<<20))},
		{metric: "cache RSS: peak cold / now warm", value: oursColdRSS["VmHWM"], unit: "MiB",
			note: fmt.Sprintf("%.1f MiB after the warm pulls (peak %.1f); distribution's proxy peak %.1f, distribution plain peak %.1f",
				oursWarmRSS["VmRSS"], oursWarmRSS["VmHWM"], proxyRSS["VmHWM"], plainRSS["VmHWM"])},
	}, nil
}

// pacedUpstream is a distribution registry whose answers share one link of cacheUpstreamRate;
// bytes counts what it sent.
type pacedUpstream struct {
	url   string
	bytes atomic.Int64
	srv   *http.Server
	app   *handlers.App
	// refuse, when not 0, is the status every request is answered (a rate limit: 429, with a
	// Retry-After); refused counts those answers.
	refuse, refused atomic.Int64

	mu   sync.Mutex
	next time.Time // when the link is free again
}

func startPacedUpstream(root string) (*pacedUpstream, error) {
	cfg := &configuration.Configuration{Storage: configuration.Storage{"filesystem": configuration.Parameters{"rootdirectory": root}}}
	cfg.HTTP.Secret = "bench-upload-secret"
	cfg.Log.AccessLog.Disabled = true
	u := &pacedUpstream{}
	u.app = handlers.NewApp(context.Background(), cfg)
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	u.srv = &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code := u.refuse.Load(); code != 0 {
			u.refused.Add(1)
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(int(code))
			return
		}
		u.app.ServeHTTP(&pacedWriter{ResponseWriter: w, u: u}, r)
	})}
	go func() { _ = u.srv.ListenAndServe() }()
	u.url = "http://" + addr
	return u, waitHTTP(u.url + "/v2/")
}

func (u *pacedUpstream) close() {
	_ = u.srv.Close()
	_ = u.app.Shutdown()
}

// wait blocks until n more bytes fit through the link.
func (u *pacedUpstream) wait(n int) {
	u.mu.Lock()
	now := time.Now()
	start := u.next
	if start.Before(now) {
		start = now
	}
	u.next = start.Add(time.Duration(float64(n) / cacheUpstreamRate * float64(time.Second)))
	u.mu.Unlock()
	time.Sleep(time.Until(start)) // the link's pace
}

type pacedWriter struct {
	http.ResponseWriter
	u *pacedUpstream
}

func (w *pacedWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), 64<<10)]
		w.u.wait(len(chunk))
		n, err := w.ResponseWriter.Write(chunk)
		written += n
		w.u.bytes.Add(int64(n))
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

func (w *pacedWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// benchImage is what pullers fetch.
type benchImage struct {
	repo, tag string
	manifest  []byte
	blobs     []ocispec.Descriptor // config, then layers
	size      int64                // manifest and blobs
	content   map[digest.Digest][]byte
}

func pushBenchImage(base, repo string) (*benchImage, error) {
	return pushImageOf(base, repo, cacheLayers, cacheLayerBytes)
}

// pushImageOf pushes an image of layers incompressible layers of layerBytes each as repo:cacheTag.
func pushImageOf(base, repo string, layers, layerBytes int) (*benchImage, error) {
	img := &benchImage{repo: repo, tag: cacheTag, content: map[digest.Digest][]byte{}}
	cfg := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers"},"repo":"` + repo + `"}`)
	add := func(mediaType string, b []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
		img.content[d.Digest] = b
		img.blobs = append(img.blobs, d)
		return d
	}
	configDesc := add(ocispec.MediaTypeImageConfig, cfg)
	for range layers {
		layer := make([]byte, layerBytes)
		if _, err := rand.Read(layer); err != nil {
			return nil, err
		}
		add(ocispec.MediaTypeImageLayerGzip, layer)
	}
	m, err := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: configDesc, Layers: img.blobs[1:]})
	if err != nil {
		return nil, err
	}
	img.manifest = m
	img.size = int64(len(m))
	for _, b := range img.blobs {
		img.size += b.Size
	}
	return img, pushContent(base, img)
}

// pushContent pushes img's blobs and manifest to the registry at base.
func pushContent(base string, img *benchImage) error {
	client := &http.Client{Timeout: time.Minute}
	for _, d := range img.blobs {
		resp, err := client.Post(base+"/v2/"+img.repo+"/blobs/uploads/", "", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("starting an upload: %s", resp.Status)
		}
		loc, err := url.Parse(base + "/v2/")
		if err != nil {
			return err
		}
		loc, err = loc.Parse(resp.Header.Get("Location"))
		if err != nil {
			return err
		}
		q := loc.Query()
		q.Set("digest", d.Digest.String())
		loc.RawQuery = q.Encode()
		if err := put(client, loc.String(), "application/octet-stream", img.content[d.Digest]); err != nil {
			return err
		}
	}
	return put(client, base+"/v2/"+img.repo+"/manifests/"+img.tag, ocispec.MediaTypeImageManifest, img.manifest)
}

func put(client *http.Client, target, contentType string, b []byte) error {
	req, err := http.NewRequest(http.MethodPut, target, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
		return fmt.Errorf("PUT %s: %s %s", target, resp.Status, msg)
	}
	return nil
}

// pullers runs n pulls of img from base at once, each as a node's containerd does it (its own
// connections; the manifest by tag, then the config and layers, three at a time), and returns
// when the last one is done. Every byte count is checked.
func pullers(ctx context.Context, n int, base string, img *benchImage) (time.Duration, error) {
	took, failed := pullAll(ctx, n, base, img)
	if len(failed) > 0 {
		return 0, failed[0]
	}
	return took, nil
}

// pullAll is pullers returning every failed pull's error.
func pullAll(ctx context.Context, n int, base string, img *benchImage) (time.Duration, []error) {
	start := time.Now()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { errs <- pullOnce(ctx, base, img) })
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	var failed []error
	for err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return took, failed
}

// pullRetries is how often a fetch is reopened without progress, as containerd's
// (core/remotes/docker's httpReadSeeker: a body cut short is reopened at its offset).
const pullRetries = 3

func pullOnce(ctx context.Context, base string, img *benchImage) error {
	client := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 4}, Timeout: 10 * time.Minute}
	defer client.CloseIdleConnections()
	get := func(path string, accept string, want int64) error {
		var got int64
		var err error
		for tries := 0; tries <= pullRetries; tries++ {
			var n int64
			n, err = fetchFrom(ctx, client, base+path, accept, got)
			got += n
			if err == nil {
				break
			}
			if n > 0 {
				tries = 0 // progress: containerd counts only retries without any
			}
		}
		if err == nil && got != want {
			err = fmt.Errorf("GET %s: %d bytes, want %d", path, got, want)
		}
		return err
	}
	if err := get("/v2/"+img.repo+"/manifests/"+img.tag, ocispec.MediaTypeImageManifest, int64(len(img.manifest))); err != nil {
		return err
	}
	sem := make(chan struct{}, 3) // containerd's default concurrent layer downloads
	errs := make(chan error, len(img.blobs))
	var wg sync.WaitGroup
	for _, d := range img.blobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs <- get("/v2/"+img.repo+"/blobs/"+d.Digest.String(), "", d.Size)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// fetchFrom reads target from byte from on and returns how many bytes it read.
func fetchFrom(ctx context.Context, client *http.Client, target, accept string, from int64) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return 0, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	want := http.StatusOK
	if from > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", from))
		want = http.StatusPartialContent
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return 0, fmt.Errorf("GET %s: %s", target, resp.Status)
	}
	return io.Copy(io.Discard, resp.Body)
}

// registryProcess is a registry (the cache, or distribution) run as its own process.
type registryProcess struct {
	cmd        *exec.Cmd
	url        string
	metricsURL string
	logs       *testenv.LogBuffer
	done       chan struct{}
	once       sync.Once
}

// startCacheProcess runs `quartermaster registry-mirror` as the StatefulSet does, with the
// rendered configuration, its ports and storage overridden by its flags.
func startCacheProcess(bin, upstream, dir string, args ...string) (*registryProcess, error) {
	conf, err := mirror.CacheConfig(mirror.CacheParams{UpstreamURL: upstream, TTL: mirror.DefaultTTL})
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "credentials"), 0o700); err != nil {
		return nil, err
	}
	config := filepath.Join(dir, mirror.ConfigFile)
	if err := os.WriteFile(config, conf, 0o600); err != nil {
		return nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	maddr, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &registryProcess{url: "http://" + addr, metricsURL: "http://" + maddr + mirror.MetricsPath}
	return p, p.start(exec.Command(bin, append([]string{"registry-mirror", "--config", config, "--credentials-dir", filepath.Join(dir, "credentials"),
		"--address=" + addr, "--metrics-address=" + maddr, "--storage-dir=" + filepath.Join(dir, "storage"), "--zap-log-level=error"}, args...)...))
}

// startDistribution runs distribution's registry as shipped: a pull-through proxy of upstream,
// or (upstream "") a plain registry, on filesystem storage, with the cache's storage settings.
func startDistribution(bin, dir, upstream string) (*registryProcess, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: %s}
  delete: {enabled: true}
  cache: {blobdescriptor: inmemory}
http: {addr: %q}
`, filepath.Join(dir, "storage"), addr)
	if upstream != "" {
		conf += fmt.Sprintf("proxy: {remoteurl: %q, ttl: 168h}\n", upstream)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	config := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(config, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	p := &registryProcess{url: "http://" + addr}
	return p, p.start(exec.Command(bin, config), "OTEL_TRACES_EXPORTER=none")
}

func (p *registryProcess) start(cmd *exec.Cmd, env ...string) error {
	p.cmd, p.logs, p.done = cmd, &testenv.LogBuffer{}, make(chan struct{})
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := waitHTTP(p.url + "/v2/"); err != nil {
		p.stop()
		return fmt.Errorf("%w\n%s", err, p.logs.Tail(4000))
	}
	return nil
}

func (p *registryProcess) stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		<-p.done
	})
}

// memory is the process's /proc status memory lines (VmRSS, VmHWM …) in MiB.
func (p *registryProcess) memory() map[string]float64 {
	m, err := (&managerProcess{cmd: p.cmd}).memory()
	if err != nil {
		return map[string]float64{}
	}
	return m
}

// metric reads one series from the cache's metrics endpoint (0 when absent).
func (p *registryProcess) metric(series string) float64 {
	resp, err := http.Get(p.metricsURL)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			_, _ = fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// waitHTTP waits until url answers 200 (a process starting).
func waitHTTP(url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("%s did not answer 200 within 30s: %w", url, err)
			}
			return fmt.Errorf("%s did not answer 200 within 30s", url)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}
