package mirrorcache

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Series of the cache's metrics.
const (
	blobHits                  = `quartermaster_mirror_cache_requests_total{result="hit",type="blob"}`
	blobMisses                = `quartermaster_mirror_cache_requests_total{result="miss",type="blob"}`
	blobCoalesced             = `quartermaster_mirror_cache_requests_total{result="coalesced",type="blob"}`
	blobPassThrough           = `quartermaster_mirror_cache_requests_total{result="pass_through",type="blob"}`
	manifestHits              = `quartermaster_mirror_cache_requests_total{result="hit",type="manifest"}`
	manifestMisses            = `quartermaster_mirror_cache_requests_total{result="miss",type="manifest"}`
	upstreamBlobBytes         = `quartermaster_mirror_upstream_bytes_total{type="blob"}`
	fillsInFlightSeries       = `quartermaster_mirror_fills_in_flight`
	fillsOK                   = `quartermaster_mirror_fills_total{result="ok"}`
	fillsUpstreamError        = `quartermaster_mirror_fills_total{result="upstream_error"}`
	fillsMismatch             = `quartermaster_mirror_fills_total{result="digest_mismatch"}`
	fillsNoSpace              = `quartermaster_mirror_fills_total{result="no_space"}`
	storeFullSeries           = `quartermaster_mirror_store_full`
	upstreamUnreachableSeries = `quartermaster_mirror_upstream_requests_total{result="unreachable"}`
	upstreamUnauthz           = `quartermaster_mirror_upstream_requests_total{result="unauthorized"}`
	servedOK                  = `quartermaster_mirror_http_requests_total{code="200",method="get"}`
)

// A pull that cannot succeed must fail well before this: it bounds a hang.
const pullTimeout = time.Minute

func mustPull(t *testing.T, hostsDir, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pullTimeout)
	defer cancel()
	if err := pull(ctx, hostsDir, ref); err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
}

// mustFail pulls ref, which must fail with an error rather than hang.
func mustFail(t *testing.T, hostsDir, ref string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pullTimeout)
	defer cancel()
	start := time.Now()
	err := pull(ctx, hostsDir, ref)
	switch {
	case err == nil:
		t.Fatalf("pulling %s succeeded, want an error", ref)
	case errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("pulling %s hung for %s: %v", ref, pullTimeout, err)
	}
	t.Logf("pulling %s failed after %s: %v", ref, time.Since(start).Round(time.Millisecond), err)
}

func TestPullThrough(t *testing.T) {
	const user, password = "puller", "pull-through-secret"
	up := startUpstream(t, authHtpasswd, password, false)
	img := up.push(t, "team/app")
	other := up.push(t, "team/other")
	files := newCacheFiles(t, up.URL, user, password)
	cache := startCache(t, files)
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)

	// First pull: the cache fetches everything from the upstream with its credentials.
	before := cache.metrics(t)
	mustPull(t, hosts, img.byTag(up))
	after := cache.metrics(t)
	seen := up.requests()
	for _, b := range img.blobs {
		if want := "GET /v2/team/app/blobs/" + b.Digest.String(); !slices.Contains(seen, want) {
			t.Errorf("the upstream did not see %q; it saw %q", want, seen)
		}
	}
	d := delta(before, after, blobMisses, manifestMisses, blobHits, servedOK)
	if d[blobMisses] != 2 || d[manifestMisses] != 1 || d[blobHits] != 0 || d[servedOK] == 0 {
		t.Errorf("first pull: metric changes %v, want 2 blob misses, 1 manifest miss, no blob hit, answers", d)
	}
	// A response ends at the digest check, before its fill's commit: until the fills are done a
	// next request joins them (coalesced, seen under load in CI), after it is a hit.
	waitMetric(t, cache, fillsInFlightSeries, func(v float64) bool { return v == 0 })
	after = cache.metrics(t)

	// Second pull by tag: the content comes from the cache; the upstream only answers the HEAD
	// that checks where the tag points now (tags move: the cache asks every time).
	before = after
	mustPull(t, hosts, img.byTag(up))
	after = cache.metrics(t)
	for _, r := range up.requests() {
		if r != "HEAD /v2/team/app/manifests/v1" {
			t.Errorf("second pull: the upstream saw %q; only the tag's HEAD may reach it", r)
		}
	}
	d = delta(before, after, blobHits, blobMisses, manifestHits, manifestMisses)
	if d[blobHits] != 2 || d[manifestHits] == 0 || d[blobMisses] != 0 || d[manifestMisses] != 0 {
		t.Errorf("second pull: metric changes %v, want 2 blob hits, manifest hits, no miss", d)
	}

	// By digest nothing reaches the upstream.
	before = after
	mustPull(t, hosts, img.byDigest(up))
	if seen := up.requests(); len(seen) != 0 {
		t.Errorf("pull by digest: the upstream saw %q, want nothing", seen)
	}
	if d := delta(before, cache.metrics(t), blobHits); d[blobHits] != 2 {
		t.Errorf("pull by digest: metric changes %v, want 2 blob hits", d)
	}

	// The upstream goes down: what the cache holds is still served, the rest fails quickly.
	up.stop()
	before = cache.metrics(t)
	mustPull(t, hosts, img.byTag(up))
	mustPull(t, hosts, img.byDigest(up))
	mustFail(t, hosts, other.byTag(up))
	if d := delta(before, cache.metrics(t), upstreamUnreachableSeries); d[upstreamUnreachableSeries] == 0 {
		t.Errorf("metric changes %v, want unreachable upstream requests counted", d)
	}

	// The cache restarts during the outage (distribution's own server panics here, issue #4038):
	// it starts, and serves the same content from its volume.
	cache.stop(t)
	restarted := startCache(t, files)
	writeHostsDir(t, hosts, up, restarted.URL)
	mustPull(t, hosts, img.byTag(up))
	mustPull(t, hosts, img.byDigest(up))
	mustFail(t, hosts, other.byTag(up))

	for _, log := range []string{cache.log.String(), restarted.log.String()} {
		if strings.Contains(log, password) {
			t.Errorf("the cache's log holds the upstream's password:\n%s", log)
		}
	}
}

func TestUpstreamRefusesCredentials(t *testing.T) {
	const wrong, right = "wrong-password-1", "right-password-2"
	up := startUpstream(t, authHtpasswd, right, false)
	img := up.push(t, "team/app")
	cache := startCache(t, newCacheFiles(t, up.URL, "puller", wrong))
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)

	before := cache.metrics(t)
	mustFail(t, hosts, img.byTag(up))
	mustFail(t, hosts, img.byDigest(up))
	if d := delta(before, cache.metrics(t), upstreamUnauthz); d[upstreamUnauthz] == 0 {
		t.Errorf("metric changes %v, want the upstream's refusals counted as unauthorized", d)
	}
	log := cache.log.String()
	// Said once, when the upstream began refusing: not at every pull.
	if n := strings.Count(log, "upstream refusing: it refused the cache's credentials"); n != 1 {
		t.Errorf("the cache's log says %d times that the upstream refused its credentials, want once:\n%s", n, log)
	}
	if strings.Contains(log, wrong) || strings.Contains(log, right) {
		t.Errorf("the cache's log holds a password:\n%s", log)
	}
}

// The token protocol (Docker Hub's, and most registries'): the credentials go to the token realm
// the upstream names, with or without an account.
func TestPullThroughTokenAuth(t *testing.T) {
	t.Run("with credentials", func(t *testing.T) {
		up := startUpstream(t, authToken, "token-secret", false)
		img := up.push(t, "team/app")
		cache := startCache(t, newCacheFiles(t, up.URL, "puller", "token-secret"))
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, cache.URL)
		mustPull(t, hosts, img.byTag(up))
		if seen := up.requests(); !slices.Contains(seen, "GET /token") {
			t.Errorf("the upstream's token realm was not asked: %q", seen)
		}
	})
	t.Run("anonymous", func(t *testing.T) {
		up := startUpstream(t, authToken, "token-secret", true)
		img := up.push(t, "team/app")
		cache := startCache(t, newCacheFiles(t, up.URL, "", ""))
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, cache.URL)
		mustPull(t, hosts, img.byTag(up))
		mustPull(t, hosts, img.byTag(up))
	})
	t.Run("anonymous refused", func(t *testing.T) {
		up := startUpstream(t, authToken, "token-secret", false)
		img := up.push(t, "team/app")
		cache := startCache(t, newCacheFiles(t, up.URL, "", ""))
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, cache.URL)
		mustFail(t, hosts, img.byTag(up))
		if log := cache.log.String(); !strings.Contains(log, "it wants credentials and the cache has none") {
			t.Errorf("the cache's log does not say the upstream wants credentials:\n%s", log)
		}
	})
}

// The cache contacts the upstream only when a request needs it: started while nothing listens at
// the upstream's address, it is ready at once (distribution, which the cache embedded before,
// panicked here: it fetched the upstream's challenge while starting, distribution issue #4038), and
// its /v2/ check sends nothing upstream.
func TestStartsWhileUpstreamDown(t *testing.T) {
	down := listenLoopback(t)
	upstreamURL := "http://" + down.Addr().String()
	down.Close() // nothing listens there any more
	cache := startCache(t, newCacheFiles(t, upstreamURL, "puller", "secret"))
	before := cache.metrics(t)
	for range 3 {
		if resp := getFrom(context.Background(), t, cache.URL+"/v2/", "", http.StatusOK); resp != nil {
			resp.Body.Close()
		}
	}
	after := cache.metrics(t)
	for _, r := range []string{resultOK, resultChallenge, resultUnauthorized, resultDenied, resultNotFound, resultError, resultUnreachable, resultCanceled} {
		series := `quartermaster_mirror_upstream_requests_total{result="` + r + `"}`
		if d := after[series] - before[series]; d != 0 {
			t.Errorf("the /v2/ check sent %v requests upstream (%s), want none", d, r)
		}
	}
}

// A redirect (to blob storage) gets the upstream's credentials only where the one rule allows:
// here another port of the upstream's address, which Go's own redirect policy would give them to
// (it compares host names, not ports). The blob is served all the same.
func TestRedirectGetsNoCredentials(t *testing.T) {
	const user, password = "puller", "redirect-secret"
	up := startUpstream(t, authHtpasswd, password, false)
	img := up.push(t, "team/app")
	layer := img.blobs[1].Digest
	req, err := http.NewRequest(http.MethodGet, up.URL+"/v2/team/app/blobs/"+layer.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth(user, password)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the layer from the upstream: %s %v", resp.Status, err)
	}
	var (
		mu   sync.Mutex
		auth []string
	)
	storage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(body)
	}))
	t.Cleanup(storage.Close)
	up.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+layer.String()) || r.Header.Get("Authorization") == "" {
			return false // the upstream's challenge first, as a registry answers
		}
		http.Redirect(w, r, storage.URL+"/layer", http.StatusTemporaryRedirect)
		return true
	})
	cache := startCache(t, newCacheFiles(t, up.URL, user, password))
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)
	mustPull(t, hosts, img.byTag(up))
	mu.Lock()
	defer mu.Unlock()
	if len(auth) != 1 || auth[0] != "" {
		t.Errorf("the blob storage the upstream redirected to got Authorization %q, want one request without", auth)
	}
}
