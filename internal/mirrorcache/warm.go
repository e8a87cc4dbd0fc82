package mirrorcache

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// Warming: what a pin names and the cache does not hold is fetched before a node asks, through the
// cache's own data path (as a client pulling it would: the pinned tag's or digest's manifest, for
// an index the manifest of each platform the pins file lists (the nodes'; none listed: this pod's
// own), the config and the layers). Of a mirror's cache
// pods, the one that owns the pin among the peers warms it; its fills ask each blob's owner first,
// so the upstream serves each blob once per mirror. A pod on a fresh volume warms what is pinned
// again. A failed warm is logged, counted and reported (report.go), and tried again after
// warmRetry.
const (
	warmRetry       = 5 * time.Minute
	warmConcurrency = 2
)

// warmer is what the loop knows of the warms: those running, and of those that failed when they
// may be tried again and why they failed.
type warmer struct {
	mu      sync.Mutex
	running map[string]bool
	retry   map[string]time.Time
	failed  map[string]string
	sem     chan struct{}
}

func newWarmer() *warmer {
	return &warmer{running: map[string]bool{}, retry: map[string]time.Time{}, failed: map[string]string{}, sem: make(chan struct{}, warmConcurrency)}
}

// warmState is what warmPins found: how many of the pins this pod owns it does not hold and
// fetches (or is about to), and those whose last fetch failed.
type warmState struct {
	warming int
	failed  []mirror.WarmFailure
}

// warmPins starts a warm of every pin this pod owns whose manifest it does not hold, and says
// where the pod's warms stand. Failures of pins no longer pinned are forgotten.
func (f *front) warmPins() warmState {
	var st warmState
	p := f.pins.Load()
	w := f.warmer
	if p == nil || f.ctx.Err() != nil { // stopping: close waits for the warms running
		w.mu.Lock()
		clear(w.failed)
		clear(w.retry)
		w.mu.Unlock()
		return st
	}
	owned := map[string]bool{}
	for repo, refs := range p.repos {
		for _, ref := range refs {
			if f.holds(repo, ref) {
				continue
			}
			key := repo + "\x00" + ref
			if f.peers != nil {
				if _, other := f.peers.set.Owner("pin:" + key); other {
					continue
				}
			}
			owned[key] = true
			w.mu.Lock()
			if msg, failed := w.failed[key]; failed && !w.running[key] {
				st.failed = append(st.failed, mirror.WarmFailure{Image: pinName(repo, ref), Error: msg})
			} else {
				st.warming++
			}
			if w.running[key] || time.Now().Before(w.retry[key]) {
				w.mu.Unlock()
				continue
			}
			w.running[key] = true
			w.mu.Unlock()
			f.wg.Go(func() {
				select {
				case w.sem <- struct{}{}:
				case <-f.ctx.Done():
					return
				}
				err := f.warm(repo, ref, p.platforms)
				<-w.sem
				w.mu.Lock()
				delete(w.running, key)
				if err != nil {
					w.retry[key] = time.Now().Add(warmRetry)
					w.failed[key] = err.Error()
				} else {
					delete(w.retry, key)
					delete(w.failed, key)
				}
				w.mu.Unlock()
				if err != nil {
					pinsWarmed.WithLabelValues("failed").Inc()
					f.log.Info("warming a pinned image failed: pulls of it will fetch it", "image", pinName(repo, ref), "error", err.Error(), "retryIn", warmRetry.String())
					return
				}
				f.warmed.Store(true)
				pinsWarmed.WithLabelValues("ok").Inc()
				f.log.Info("pinned image warmed", "image", pinName(repo, ref))
			})
		}
	}
	w.mu.Lock()
	for key := range w.failed {
		if !owned[key] {
			delete(w.failed, key)
			delete(w.retry, key)
		}
	}
	w.mu.Unlock()
	return st
}

func pinName(repo, ref string) string {
	if _, err := digest.Parse(ref); err == nil {
		return repo + "@" + ref
	}
	return repo + ":" + ref
}

// holds reports whether the store has the manifest a pin names.
func (f *front) holds(repo, ref string) bool {
	d, err := digest.Parse(ref)
	if err != nil {
		var ok bool
		if d, ok = f.store.tag(repo, ref); !ok {
			return false
		}
	}
	return f.store.content(d) != nil
}

// warm pulls a pin through the cache's own data path: of an index, the manifest of each of
// platforms it lists (none given: the pod's own platform), and an error only when it lists none of
// them.
func (f *front) warm(repo, ref string, platforms []string) error {
	if len(platforms) == 0 {
		platforms = []string{runtime.GOOS + "/" + runtime.GOARCH}
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Minute)
	defer cancel()
	m, err := f.warmGet(ctx, repo, "manifests", ref, true)
	if err != nil {
		return err
	}
	var parsed struct {
		Manifests []struct {
			Digest   digest.Digest `json:"digest"`
			Platform *struct {
				OS           string `json:"os"`
				Architecture string `json:"architecture"`
			} `json:"platform"`
		} `json:"manifests"`
		Config *struct {
			Digest digest.Digest `json:"digest"`
		} `json:"config"`
		Layers []struct {
			Digest digest.Digest `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(m, &parsed); err != nil {
		return fmt.Errorf("the manifest of %s does not parse: %w", pinName(repo, ref), err)
	}
	if len(parsed.Manifests) > 0 { // an index: the manifests of the platforms the nodes run
		warmed := map[digest.Digest]bool{}
		for _, c := range parsed.Manifests {
			if c.Platform == nil || warmed[c.Digest] || !slices.Contains(platforms, c.Platform.OS+"/"+c.Platform.Architecture) {
				continue
			}
			if err := f.warm(repo, c.Digest.String(), platforms); err != nil {
				return err
			}
			warmed[c.Digest] = true
		}
		if len(warmed) == 0 {
			return fmt.Errorf("%s has no manifest for %s", pinName(repo, ref), strings.Join(platforms, " or "))
		}
		return nil
	}
	var blobs []digest.Digest
	if parsed.Config != nil {
		blobs = append(blobs, parsed.Config.Digest)
	}
	for _, l := range parsed.Layers {
		blobs = append(blobs, l.Digest)
	}
	for _, d := range blobs {
		if _, err := f.warmGet(ctx, repo, "blobs", d.String(), false); err != nil {
			return err
		}
	}
	return nil
}

// warmGet sends a GET of /v2/<repo>/<kind>/<ref> to the cache's own handler and returns a
// manifest's body (a blob's is read and dropped).
func (f *front) warmGet(ctx context.Context, repo, kind, ref string, manifest bool) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/v2/"+repo+"/"+kind+"/"+ref, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", manifestAccept)
	w := &warmWriter{header: http.Header{}, keep: manifest}
	f.ServeHTTP(w, req)
	if w.status != http.StatusOK && w.status != 0 {
		return nil, fmt.Errorf("GET %s: %d %s", req.URL.Path, w.status, bytes.TrimSpace(w.body.Bytes()))
	}
	return w.body.Bytes(), nil
}

// warmWriter is the response of a warm's request: its status, a manifest's body (at most
// maxManifestBytes), a blob's bytes dropped.
type warmWriter struct {
	header http.Header
	status int
	keep   bool
	body   bytes.Buffer
}

func (w *warmWriter) Header() http.Header { return w.header }

func (w *warmWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *warmWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if (w.keep || w.status != http.StatusOK) && w.body.Len() < maxManifestBytes {
		w.body.Write(b[:min(len(b), maxManifestBytes-w.body.Len())])
	}
	return len(b), nil
}

func (w *warmWriter) Flush() {}
