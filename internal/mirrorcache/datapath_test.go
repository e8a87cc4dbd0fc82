package mirrorcache

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

// Upstream fault modes for a blob GET.
const (
	serveWhole    = "whole"     // the right bytes
	serve5xx      = "5xx"       // 503 before any byte
	serveReset    = "reset"     // the connection aborted mid-body
	serveTruncate = "truncated" // the body ends early (Content-Length announced in full)
	serveMismatch = "mismatch"  // the right length, other bytes
)

// gateFirst is how much of a gated blob the upstream sends before it waits (and how much a
// stand-in peer sends before it fails).
const gateFirst = 1 << 20

// gatedBlob answers the upstream's GETs of one blob itself: the first gateFirst bytes, then it
// waits for release and ends the body as mode says. Only the first GET is gated unless every.
type gatedBlob struct {
	d       digest.Digest
	b       []byte
	mode    string
	every   bool
	sent    chan struct{} // closed once the first part was written
	release chan struct{}
	once    sync.Once
}

func newGate(b []byte, mode string) *gatedBlob {
	return &gatedBlob{d: digest.FromBytes(b), b: b, mode: mode, sent: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedBlob) fault(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+g.d.String()) {
		return false
	}
	gated := false
	g.once.Do(func() { gated = true })
	if !gated && !g.every {
		return false
	}
	if g.mode == serve5xx {
		http.Error(w, "upstream trouble", http.StatusServiceUnavailable)
		return true
	}
	w.Header().Set("Content-Length", fmt.Sprint(len(g.b)))
	w.Header().Set("Docker-Content-Digest", g.d.String())
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(g.b[:gateFirst])
	_ = http.NewResponseController(w).Flush()
	if gated {
		close(g.sent)
		select {
		case <-g.release:
		case <-r.Context().Done():
			return true
		}
	}
	switch g.mode {
	case serveReset:
		panic(http.ErrAbortHandler)
	case serveTruncate:
		_, _ = w.Write(g.b[gateFirst : len(g.b)-1])
	case serveMismatch:
		_, _ = w.Write(randomBytes(len(g.b) - gateFirst))
	default:
		_, _ = w.Write(g.b[gateFirst:])
	}
	return true
}

// getFrom sends a GET (with a Range header when rng is set) and checks the status.
func getFrom(ctx context.Context, t *testing.T, url, rng string, want int) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Error(err)
		return nil
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Errorf("GET %s: %v", url, err)
		return nil
	}
	if resp.StatusCode != want {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		resp.Body.Close()
		t.Errorf("GET %s: %s %q, want %d", url, resp.Status, b, want)
		return nil
	}
	return resp
}

// waitMetric waits until the cache's metric satisfies ok (a condition, not a time).
func waitMetric(t *testing.T, c *runningCache, name string, ok func(float64) bool) {
	t.Helper()
	testenv.PollFor(t, "the cache's "+name+" to meet the test's condition", 5*time.Millisecond, 30*time.Second, func() (bool, string) {
		v := c.metrics(t)[name]
		return ok(v), fmt.Sprintf("%s is %v", name, v)
	})
}

func count(seen []string, want string) int {
	n := 0
	for _, s := range seen {
		if s == want {
			n++
		}
	}
	return n
}

func TestConcurrentMissesCoalesced(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(4 << 20)
	img := up.pushImage(t, "team/app", []byte(`{"architecture":"amd64","os":"linux"}`), layer)
	files := newCacheFiles(t, up.URL, "", "")
	cache := startCache(t, files)
	g := newGate(layer, serveWhole)
	up.setFault(g.fault)
	blobURL := cache.URL + "/v2/team/app/blobs/" + g.d.String()
	before := cache.metrics(t)

	// The first client starts the fill, reads the first MiB while the upstream holds the rest,
	// and leaves: the fill goes on.
	leaderCtx, leave := context.WithCancel(context.Background())
	defer leave()
	leader := getFrom(leaderCtx, t, blobURL, "", http.StatusOK)
	if leader == nil {
		t.FailNow()
	}
	if _, err := io.ReadFull(leader.Body, make([]byte, 1<<19)); err != nil {
		t.Fatalf("the first MiB did not arrive before the rest of the blob was sent: %v", err)
	}

	// Followers join the fill in flight: each gets the first MiB while the upstream still holds
	// the rest (bytes stream as they arrive), then the whole blob.
	const followers = 8
	firstMiB := make(chan struct{}, followers+1)
	var wg sync.WaitGroup
	bodies := make([][]byte, followers)
	for i := range followers {
		wg.Go(func() {
			resp := getFrom(context.Background(), t, blobURL, "", http.StatusOK)
			if resp == nil {
				firstMiB <- struct{}{}
				return
			}
			defer resp.Body.Close()
			head := make([]byte, 1<<19) // within what the upstream sent so far
			_, err := io.ReadFull(resp.Body, head)
			firstMiB <- struct{}{}
			if err != nil {
				t.Errorf("follower %d: %v", i, err)
				return
			}
			rest, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Errorf("follower %d: %v", i, err)
			}
			bodies[i] = append(head, rest...)
		})
	}
	// Range requests while the fill runs: one in the part already fetched, one beyond it.
	var early, late []byte
	wg.Go(func() {
		if resp := getFrom(context.Background(), t, blobURL, "bytes=100-199", http.StatusPartialContent); resp != nil {
			early, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		firstMiB <- struct{}{}
	})
	wg.Go(func() {
		if resp := getFrom(context.Background(), t, blobURL, "bytes=3145728-", http.StatusPartialContent); resp != nil {
			late, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	})
	for range followers + 1 {
		<-firstMiB
	}
	leave()
	leader.Body.Close()
	waitMetric(t, cache, blobCoalesced, func(v float64) bool { return v-before[blobCoalesced] == followers+2 })
	close(g.release)
	wg.Wait()

	for i, b := range bodies {
		if !bytes.Equal(b, layer) {
			t.Errorf("follower %d got %d bytes, not the blob", i, len(b))
		}
	}
	if !bytes.Equal(early, layer[100:200]) || !bytes.Equal(late, layer[3145728:]) {
		t.Errorf("range answers: %d and %d bytes, not the blob's", len(early), len(late))
	}
	waitMetric(t, cache, fillsInFlightSeries, func(v float64) bool { return v == 0 })
	seen := up.requests()
	if n := count(seen, "GET /v2/team/app/blobs/"+g.d.String()); n != 1 || slices.Contains(seen, "HEAD /v2/team/app/blobs/"+g.d.String()) {
		t.Errorf("the upstream saw %q: want exactly one GET of the blob and no HEAD", seen)
	}
	d := delta(before, cache.metrics(t), upstreamBlobBytes, fillsOK, blobMisses)
	if d[upstreamBlobBytes] != float64(len(layer)) || d[fillsOK] != 1 || d[blobMisses] != 1 {
		t.Errorf("metric changes %v: want the blob's %d bytes from the upstream once, one fill, one miss", d, len(layer))
	}

	// The fill was committed although its first client left: served from the volume.
	resp := getFrom(context.Background(), t, blobURL, "", http.StatusOK)
	if b, _ := io.ReadAll(resp.Body); !bytes.Equal(b, layer) {
		t.Errorf("after the fill: %d bytes, not the blob", len(b))
	}
	resp.Body.Close()
	if seen := up.requests(); len(seen) != 0 {
		t.Errorf("a hit reached the upstream: %q", seen)
	}

	// Concurrent pulls of the manifest by tag: one fetch of the manifest.
	manifestURL := cache.URL + "/v2/team/app/manifests/" + testTag
	var mw sync.WaitGroup
	for range 8 {
		mw.Go(func() {
			if resp := getFrom(context.Background(), t, manifestURL, "", http.StatusOK); resp != nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if digest.FromBytes(b) != img.manifest.Digest {
					t.Errorf("manifest: got %d bytes of digest %s", len(b), digest.FromBytes(b))
				}
			}
		})
	}
	mw.Wait()
	if n := count(up.requests(), "GET /v2/team/app/manifests/"+img.manifest.Digest.String()); n != 1 {
		t.Errorf("the upstream served the manifest %d times, want 1", n)
	}
}

// An upstream that fails a fill: every waiting client gets an error (never a short or wrong body
// with a 200 that looks complete), nothing is committed, and the next request fetches again.
func TestFillFaults(t *testing.T) {
	for _, mode := range []string{serve5xx, serveReset, serveTruncate, serveMismatch} {
		t.Run(mode, func(t *testing.T) {
			up := startUpstream(t, authNone, "", false)
			layer := randomBytes(2 << 20)
			up.pushImage(t, "team/app", []byte(`{}`), layer)
			files := newCacheFiles(t, up.URL, "", "")
			cache := startCache(t, files)
			g := newGate(layer, mode)
			g.every = mode == serveMismatch || mode == serve5xx
			up.setFault(g.fault)
			blobURL := cache.URL + "/v2/team/app/blobs/" + g.d.String()
			before := cache.metrics(t)

			var wg sync.WaitGroup
			started := make(chan struct{}, 3)
			for i := range 3 {
				wg.Go(func() {
					want := http.StatusOK
					if mode == serve5xx {
						want = http.StatusBadGateway
					}
					resp := getFrom(context.Background(), t, blobURL, "", want)
					started <- struct{}{}
					if resp == nil || want != http.StatusOK {
						return
					}
					defer resp.Body.Close()
					if b, err := io.ReadAll(resp.Body); err == nil {
						t.Errorf("client %d: a complete answer of %d bytes from a failed fill", i, len(b))
					}
				})
			}
			if mode != serve5xx {
				for range 3 {
					<-started
				}
				close(g.release)
			}
			wg.Wait()
			waitMetric(t, cache, fillsInFlightSeries, func(v float64) bool { return v == 0 })
			failed := fillsUpstreamError
			if mode == serveMismatch {
				failed = fillsMismatch
			}
			if d := delta(before, cache.metrics(t), failed, fillsOK); d[fillsOK] != 0 || d[failed] < 1 {
				t.Errorf("metric changes %v: want a failed fill and none committed", d)
			}
			assertNotStored(t, files, g.d)

			// The next request fetches again: the right bytes, or for a mismatching upstream
			// the same refusal (nothing was cached). Its GET is gated too: the client has the
			// headers before the mismatching rest fails the fill (an ungated fill may fail first,
			// and the client is rightly answered 502).
			if mode == serveMismatch {
				again := newGate(layer, mode)
				up.setFault(again.fault)
				resp := getFrom(context.Background(), t, blobURL, "", http.StatusOK)
				close(again.release)
				if resp != nil {
					if _, err := io.ReadAll(resp.Body); err == nil {
						t.Error("a mismatching blob was served in full")
					}
					resp.Body.Close()
				}
				if n := count(up.requests(), "GET /v2/team/app/blobs/"+g.d.String()); n != 2 {
					t.Errorf("the upstream was asked %d times, want 2 (a refused blob is not cached)", n)
				}
				assertNotStored(t, files, g.d)
				return
			}
			up.setFault(nil)
			resp := getFrom(context.Background(), t, blobURL, "", http.StatusOK)
			if resp == nil {
				t.FailNow()
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(b, layer) {
				t.Errorf("after the fault: %d bytes (%v), not the blob", len(b), err)
			}
		})
	}
}

// assertNotStored checks d is neither committed nor left partial in the cache's volume.
func assertNotStored(t *testing.T, files cacheFiles, d digest.Digest) {
	t.Helper()
	root := filepath.Join(files.storage, contentDir)
	if _, err := os.Stat(filepath.Join(root, "blobs", "sha256", d.Encoded())); err == nil {
		t.Errorf("%s was committed", d)
	}
	if tmp, _ := os.ReadDir(filepath.Join(root, "tmp")); len(tmp) != 0 {
		t.Errorf("partial files left: %v", tmp)
	}
}
