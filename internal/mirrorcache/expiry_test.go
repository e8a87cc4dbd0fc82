package mirrorcache

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// fakeClock is the time the cache's ttls count on; the test moves it.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func stored(files cacheFiles, d digest.Digest) bool {
	_, err := os.Stat(filepath.Join(files.storage, contentDir, "blobs", "sha256", d.Encoded()))
	return err == nil
}

// Two repositories share a layer; one expires while the other is pulled, with the upstream up
// and then down: every pull is correct, the ttl counts from the last pull, and content is
// deleted only when no kept manifest references it.
func TestExpiryKeepsSharedContent(t *testing.T) {
	const ttl = time.Hour
	up := startUpstream(t, authNone, "", false)
	shared := randomBytes(1 << 20)
	a := up.pushImage(t, "team/a", []byte(`{"architecture":"amd64","os":"linux","a":1}`), shared, randomBytes(4096))
	b := up.pushImage(t, "team/b", []byte(`{"architecture":"amd64","os":"linux","b":1}`), shared, randomBytes(4096))
	sharedDigest := a.blobs[1].Digest
	clock := newFakeClock()
	var data *front
	files := newCacheFilesTTL(t, up.URL, "", "", ttl)
	cache := startCacheWith(t, files, Options{now: clock.now, started: func(f *front) { data = f }})
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)

	mustPull(t, hosts, a.byTag(up))
	waitCommitted(t, data, append([]digest.Digest{a.manifest.Digest}, digestsOf(a.blobs)...)...)
	up.requests()
	// b's manifest comes from the upstream, which names the shared layer: b is served the copy
	// a's pull stored, not fetched again.
	mustPull(t, hosts, b.byTag(up))
	waitCommitted(t, data, append([]digest.Digest{b.manifest.Digest}, digestsOf(b.blobs)...)...)
	if seen := up.requests(); slices.Contains(seen, "GET /v2/team/b/blobs/"+sharedDigest.String()) {
		t.Errorf("the shared layer was fetched again for team/b: %q", seen)
	}
	// A repository that did not get the layer through a manifest is served the stored copy only
	// after the upstream confirms it has it: a HEAD, no body.
	c := up.pushImage(t, "team/c", []byte(`{"c":1}`), shared)
	resp := getFrom(context.Background(), t, cache.URL+"/v2/team/c/blobs/"+sharedDigest.String(), "", http.StatusOK)
	if resp != nil {
		resp.Body.Close()
	}
	if seen := up.requests(); !slices.Equal(seen, []string{"HEAD /v2/team/c/blobs/" + sharedDigest.String()}) {
		t.Errorf("serving the stored layer to team/c: the upstream saw %q, want one HEAD", seen)
	}
	_ = c
	if resp := getFrom(context.Background(), t, cache.URL+"/v2/team/none/blobs/"+sharedDigest.String(), "", http.StatusNotFound); resp != nil {
		resp.Body.Close()
	}

	// b is pulled again 40 minutes later, a is not.
	clock.advance(40 * time.Minute)
	mustPull(t, hosts, b.byTag(up))

	// At 70 minutes a's pull is older than the ttl: a's own content goes, the shared layer stays
	// (b's manifest references it), and b pulls while the sweep runs.
	clock.advance(30 * time.Minute)
	var wg sync.WaitGroup
	wg.Go(func() { mustPull(t, hosts, b.byTag(up)) })
	data.sweep()
	wg.Wait()
	if !stored(files, sharedDigest) || !stored(files, b.blobs[2].Digest) {
		t.Error("content b's manifest references was deleted")
	}
	if stored(files, a.blobs[2].Digest) || stored(files, a.blobs[0].Digest) || stored(files, a.manifest.Digest) {
		t.Error("a's own content outlived its ttl")
	}
	up.requests()
	mustPull(t, hosts, b.byTag(up))
	if seen := up.requests(); !slices.Equal(seen, []string{"HEAD /v2/team/b/manifests/" + testTag}) {
		t.Errorf("pulling b after a expired: the upstream saw %q, want only the tag's HEAD", seen)
	}

	// The upstream goes down. b was pulled within the ttl, so it keeps serving, by tag and
	// digest, even as sweeps pass: its ttl counts from each pull, not from its one fetch.
	up.stop()
	for range 3 {
		clock.advance(50 * time.Minute)
		data.sweep()
		var wg sync.WaitGroup
		wg.Go(func() { mustPull(t, hosts, b.byTag(up)) })
		wg.Go(func() { mustPull(t, hosts, b.byDigest(up)) })
		data.sweep()
		wg.Wait()
	}
	mustFail(t, hosts, a.byTag(up))

	// Not pulled for longer than the ttl, b goes too, shared layer included.
	clock.advance(2 * ttl)
	data.sweep()
	for _, d := range append([]digest.Digest{b.manifest.Digest}, sharedDigest, b.blobs[0].Digest) {
		if stored(files, d) {
			t.Errorf("%s outlived every reference and its ttl", d)
		}
	}
	mustFail(t, hosts, b.byDigest(up))
}
