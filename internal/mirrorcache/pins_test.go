package mirrorcache

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// writePins writes a pins file naming refs (in use).
func writePins(t *testing.T, path string, refs ...string) {
	t.Helper()
	p := mirror.Pins{Images: map[string]string{}}
	for _, r := range refs {
		p.Images[r] = ""
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // a new file, as the kubelet's swap makes one
		t.Fatal(err)
	}
}

// An image in use outlives its ttl: pinned by tag, its manifest, config, layers and tag stay
// through sweeps long after its last pull, and it is served with the upstream down; the image
// beside it, not pinned, expires. When the pin goes (the file changes), so does the image.
func TestPinnedImageOutlivesItsTTL(t *testing.T) {
	const ttl = time.Hour
	up := startUpstream(t, authNone, "", false)
	shared := randomBytes(1 << 16)
	inUse := up.pushImage(t, "team/in-use", []byte(`{"architecture":"amd64","os":"linux","in-use":1}`), shared, randomBytes(4096))
	idle := up.pushImage(t, "team/idle", []byte(`{"architecture":"amd64","os":"linux","idle":1}`), shared, randomBytes(4096))
	byDigest := up.pushImage(t, "team/by-digest", []byte(`{"architecture":"amd64","os":"linux","by-digest":1}`), randomBytes(4096))
	pinsPath := filepath.Join(t.TempDir(), mirror.PinsFile)
	writePins(t, pinsPath, "team/in-use:"+testTag, "team/by-digest@"+byDigest.manifest.Digest.String(), "team/never-pulled:v9")
	clock := newFakeClock()
	var data *front
	files := newCacheFilesTTL(t, up.URL, "", "", ttl)
	cache := startCacheWith(t, files, Options{now: clock.now, PinsPath: pinsPath, started: func(f *front) { data = f }})
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)
	if got := cache.metrics(t)["quartermaster_mirror_pinned_images"]; got != 3 {
		t.Errorf("pinned_images = %v at start, want 3 (read before the first sweep)", got)
	}

	for _, img := range []testImage{inUse, idle, byDigest} {
		mustPull(t, hosts, img.byTag(up))
		// A fill commits once its client has every byte: the clock moves on only after.
		waitCommitted(t, data, append([]digest.Digest{img.manifest.Digest}, digestsOf(img.blobs)...)...)
	}
	for range 3 {
		clock.advance(2 * ttl)
		data.sweep()
	}
	kept := []digest.Digest{inUse.manifest.Digest, inUse.blobs[0].Digest, inUse.blobs[1].Digest, inUse.blobs[2].Digest, byDigest.manifest.Digest, byDigest.blobs[1].Digest}
	for _, d := range kept {
		if !stored(files, d) {
			t.Errorf("pinned content %s expired", d)
		}
	}
	if stored(files, idle.manifest.Digest) || stored(files, idle.blobs[2].Digest) {
		t.Error("the idle image outlived its ttl")
	}
	up.stop()
	mustPull(t, hosts, inUse.byTag(up))
	mustPull(t, hosts, byDigest.byDigest(up))
	mustFail(t, hosts, idle.byTag(up))

	// The workload is gone and its ttl after it too: the controller drops the pin.
	writePins(t, pinsPath, "team/by-digest@"+byDigest.manifest.Digest.String())
	// Every 100 ms: the cache looks at the file every flushInterval.
	testenv.PollFor(t, "the changed pins file to be read again (1 pinned image)", 100*time.Millisecond, 30*time.Second, func() (bool, string) {
		n := cache.metrics(t)["quartermaster_mirror_pinned_images"]
		return n == 1, fmt.Sprintf("%v pinned images", n)
	})
	clock.advance(2 * ttl)
	data.sweep()
	if stored(files, inUse.blobs[2].Digest) || !stored(files, byDigest.blobs[1].Digest) {
		t.Errorf("after the pin went: the unpinned layer stored %v, the still pinned one %v", stored(files, inUse.blobs[2].Digest), stored(files, byDigest.blobs[1].Digest))
	}
	// A file that does not parse keeps the last pins.
	if err := os.WriteFile(pinsPath, []byte(`{"images":{"not a pin":""}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.PollFor(t, "the bad pins file to be reported", 100*time.Millisecond, 30*time.Second, func() (bool, string) {
		out := cache.log.String()
		return strings.Contains(out, "the pins file does not parse"), "logs:\n" + out
	})
	clock.advance(2 * ttl)
	data.sweep()
	if !stored(files, byDigest.blobs[1].Digest) {
		t.Error("a bad pins file released the pinned content")
	}
}

// The eviction rule with pins: pinned content is passed over however old its last pull, the
// next least recently pulled goes instead; pinned content alone above the high-water mark is
// said (the gauge), once.
func TestEvictionPassesOverPinnedContent(t *testing.T) {
	clock := newFakeClock()
	dir := t.TempDir()
	s, err := openStore(dir, clock.now)
	if err != nil {
		t.Fatal(err)
	}
	// Three images of one layer each, pulled an hour apart: old (pinned by tag), mid, new.
	images := map[string][2]digest.Digest{}
	for _, name := range []string{"old", "mid", "new"} {
		layer := randomBytes(1000)
		ld := digest.FromBytes(layer)
		manifest := []byte(`{"layers":["` + ld.String() + `"],"name":"` + name + `"}`)
		md := digest.FromBytes(manifest)
		for d, b := range map[digest.Digest][]byte{ld: layer, md: manifest} {
			if err := os.WriteFile(s.path(d), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		s.committed(ld, nil)
		s.committed(md, &contentMeta{MediaType: "application/vnd.oci.image.manifest.v1+json", Refs: []digest.Digest{ld}})
		s.pulled("team/"+name, ld, false)
		s.pulled("team/"+name, md, true)
		s.setTag("team/"+name, "v1", md)
		images[name] = [2]digest.Digest{md, ld}
		clock.advance(time.Hour)
	}
	f := newFront(nil, nil, s, 0, dir, logr.Discard())
	p, err := newPins(mirror.Pins{Images: map[string]string{"team/old:v1": ""}})
	if err != nil {
		t.Fatal(err)
	}
	f.pins.Store(p)
	size := uint64(3300) // the three images: above 85%
	f.volume = func() (uint64, uint64, error) {
		var used uint64
		for _, im := range images {
			for _, d := range im {
				if info, err := os.Stat(s.path(d)); err == nil {
					used += uint64(info.Size())
				}
			}
		}
		return size, size - min(used, size), nil
	}
	f.bound()
	var left []string
	for name, im := range images {
		if s.content(im[0]) != nil && s.content(im[1]) != nil {
			left = append(left, name)
		}
	}
	slices.Sort(left)
	if !slices.Equal(left, []string{"new", "old"}) {
		t.Errorf("left after eviction: %q, want the pinned old image and the new one", left)
	}
	if _, ok := s.tag("team/old", "v1"); !ok {
		t.Error("the pinned tag was forgotten")
	}
	if f.pinnedOver {
		t.Error("pinned content said to be above the mark at 1/3 of the volume")
	}
	size = 1100 // the pinned image alone fills 95% of it
	f.bound()
	if !f.pinnedOver || s.content(images["old"][1]) == nil {
		t.Errorf("pinned content alone above the mark: said %v, evicted %v", f.pinnedOver, s.content(images["old"][1]) == nil)
	}
}

// A pinned image the cache does not hold is fetched before any node asks: with the upstream gone
// afterwards, a node's first pull of it is served. A pin of an image the upstream does not have is
// a failed warm, logged with the image's name and counted, and reported with the upstream's answer.
// The reports follow the state: the pins file read (its hash), the bytes pinned content takes,
// nothing fetching once the warms ended, and the same report never sent twice in a row.
func TestPinsAreWarmed(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(1 << 16)
	img := up.pushImage(t, "team/warm", []byte(`{"architecture":"amd64","os":"linux","warm":1}`), layer)
	pinsPath := filepath.Join(t.TempDir(), mirror.PinsFile)
	writePins(t, pinsPath, "team/warm:"+testTag, "team/absent:v1")
	pinsFile, err := os.ReadFile(pinsPath)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		reports []mirror.CacheReport
	)
	report := func(_ context.Context, r mirror.CacheReport) error {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, r)
		return nil
	}
	files := newCacheFiles(t, up.URL, "", "")
	cache := startCacheWith(t, files, Options{PinsPath: pinsPath, Report: report})
	const ok, failed = `quartermaster_mirror_pins_warmed_total{result="ok"}`, `quartermaster_mirror_pins_warmed_total{result="failed"}`
	waitMetric(t, cache, ok, func(v float64) bool { return v == 1 })
	waitMetric(t, cache, failed, func(v float64) bool { return v == 1 })
	var last mirror.CacheReport
	testenv.Eventually(t, "a report of the warms' end", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		if len(reports) == 0 {
			return false, "no report"
		}
		last = reports[len(reports)-1]
		return last.Warming == 0 && len(last.Failed) == 1 && last.Bytes >= int64(len(layer)), last.Annotation()
	})
	if last.PinsHash != mirror.PinsHash(pinsFile) || last.Pinned != 2 || last.FailedCount != 1 ||
		last.Failed[0].Image != "team/absent:v1" || !strings.Contains(last.Failed[0].Error, "404") {
		t.Errorf("the last report %s, want the pins file's hash %s, 2 pinned, team/absent:v1 failed with the upstream's 404", last.Annotation(), mirror.PinsHash(pinsFile))
	}
	mu.Lock()
	for i := 1; i < len(reports); i++ {
		if reports[i].Annotation() == reports[i-1].Annotation() {
			t.Errorf("report %d is sent again: %s", i, reports[i].Annotation())
		}
	}
	mu.Unlock()
	for _, d := range append([]digest.Digest{img.manifest.Digest}, img.blobs[0].Digest, img.blobs[1].Digest) {
		if !stored(files, d) {
			t.Errorf("%s was not warmed", d)
		}
	}
	if log := cache.log.String(); !strings.Contains(log, "warming a pinned image failed") || !strings.Contains(log, "team/absent:v1") {
		t.Errorf("the failed warm is not logged with the image's name:\n%s", log)
	}
	up.stop()
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)
	mustPull(t, hosts, img.byTag(up))
}

// waitCommitted waits until the cache's index holds each of ds: a fill's responses finish before
// it is committed (made durable, renamed, indexed), so a test that moves a fake clock right after
// a pull waits for the commits first, or the pull's content would count as pulled later.
func waitCommitted(t *testing.T, f *front, ds ...digest.Digest) {
	t.Helper()
	for _, d := range ds {
		testenv.PollFor(t, fmt.Sprintf("%s to be committed", d), 10*time.Millisecond, time.Minute, func() (bool, string) {
			return f.store.content(d) != nil, "not committed"
		})
	}
}

func digestsOf(descs []ocispec.Descriptor) []digest.Digest {
	out := make([]digest.Digest, len(descs))
	for i, d := range descs {
		out[i] = d.Digest
	}
	return out
}

// A pinned multi-platform image is warmed for every platform the cluster's nodes run (the pins
// file's platforms): an index of linux/amd64, linux/arm64 and linux/s390x, pinned for a cluster of
// amd64 and arm64 nodes, has both of theirs fetched, manifest, config and layers, and nothing of
// s390x's. Pinned for s390x nodes alone, an index without their platform is a failed warm saying so.
func TestPinsWarmEveryNodePlatform(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	images := map[string]testImage{}
	var index ocispec.Index
	index.SchemaVersion, index.MediaType = 2, ocispec.MediaTypeImageIndex
	for _, arch := range []string{"amd64", "arm64", "s390x"} {
		img := up.pushImage(t, "team/multi", []byte(`{"architecture":"`+arch+`","os":"linux"}`), randomBytes(4096))
		images[arch] = img
		desc := img.manifest
		desc.Platform = &ocispec.Platform{OS: "linux", Architecture: arch}
		index.Manifests = append(index.Manifests, desc)
	}
	b, err := json.Marshal(index)
	if err != nil {
		t.Fatal(err)
	}
	up.do(t, http.MethodPut, up.URL+"/v2/team/multi/manifests/multi", ocispec.MediaTypeImageIndex, b, http.StatusCreated)
	up.do(t, http.MethodPut, up.URL+"/v2/team/multi/manifests/s390x-only", ocispec.MediaTypeImageIndex, func() []byte {
		only := index
		only.Manifests = index.Manifests[2:]
		b, err := json.Marshal(only)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}(), http.StatusCreated)

	pinsPath := filepath.Join(t.TempDir(), mirror.PinsFile)
	pins, err := json.Marshal(mirror.Pins{Images: map[string]string{"team/multi:multi": ""}, Platforms: []string{"linux/amd64", "linux/arm64"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pinsPath, pins, 0o644); err != nil {
		t.Fatal(err)
	}
	files := newCacheFiles(t, up.URL, "", "")
	cache := startCacheWith(t, files, Options{PinsPath: pinsPath})
	for _, arch := range []string{"amd64", "arm64"} {
		img := images[arch]
		for _, d := range append([]digest.Digest{img.manifest.Digest}, digestsOf(img.blobs)...) {
			waitStored(t, files, d)
		}
	}
	waitMetric(t, cache, `quartermaster_mirror_pinned_images`, func(v float64) bool { return v == 1 })
	for _, d := range append([]digest.Digest{images["s390x"].manifest.Digest}, digestsOf(images["s390x"].blobs)...) {
		if stored(files, d) {
			t.Errorf("s390x content %s was fetched for a cluster of amd64 and arm64 nodes", d)
		}
	}

	pins, err = json.Marshal(mirror.Pins{Images: map[string]string{"team/multi:s390x-only": ""}, Platforms: []string{"linux/amd64"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pinsPath+".new", pins, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(pinsPath+".new", pinsPath); err != nil {
		t.Fatal(err)
	}
	testenv.PollFor(t, "the warm of an index without the nodes' platform to fail saying so", 50*time.Millisecond, 30*time.Second, func() (bool, string) {
		out := cache.log.String()
		return strings.Contains(out, "team/multi:s390x-only has no manifest for linux/amd64"), "logs:\n" + out
	})
}
