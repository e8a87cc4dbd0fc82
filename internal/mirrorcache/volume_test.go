package mirrorcache

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// heldContent is a manifest the earlier release stored: its bytes, media type and references.
type heldContent struct {
	b         []byte
	mediaType string
	refs      []digest.Digest
}

// writeEarlierVolume writes a storage directory as the release that embedded distribution left it (its
// store.go and distribution v3.1.2's filesystem layout, written out here by hand so that a change
// of this release's own types cannot change the fixture): the store under quartermaster/ (content
// by digest, index.json, a fill cut by a kill under tmp/ and an index write cut the same way) and,
// under docker/, what distribution stored in the releases before the store (a repository's tag
// and its blob) and its expiry state.
//
// The store holds manifest and blobs pulled for repo by tag, as the earlier release's index
// records them.
func writeEarlierVolume(t *testing.T, storage, repo, tag string, manifest heldContent, blobs ...[]byte) {
	t.Helper()
	when := time.Now().UTC().Format(time.RFC3339Nano)
	write := func(path string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store := filepath.Join(storage, "quartermaster")
	md := digest.FromBytes(manifest.b)
	write(filepath.Join(store, "blobs", "sha256", md.Encoded()), manifest.b)
	refs, _ := json.Marshal(manifest.refs)
	content := fmt.Sprintf(`%q:{"lastPull":%q,"mediaType":%q,"refs":%s}`, md, when, manifest.mediaType, refs)
	repoBlobs := ""
	for i, b := range blobs {
		d := digest.FromBytes(b)
		write(filepath.Join(store, "blobs", "sha256", d.Encoded()), b)
		content += fmt.Sprintf(`,%q:{"lastPull":%q}`, d, when)
		if i > 0 {
			repoBlobs += ","
		}
		repoBlobs += fmt.Sprintf(`%q:%q`, d, when)
	}
	index := fmt.Sprintf(`{"content":{%s},"repos":{%q:{"tags":{%q:%q},"manifests":{%q:%q},"blobs":{%s}}}}`,
		content, repo, tag, md, md, when, repoBlobs)
	write(filepath.Join(store, "index.json"), []byte(index))
	// A fill and an index write cut by a kill: never served, never read.
	write(filepath.Join(store, "tmp", digest.FromString("cut").Encoded()+"-123456"), []byte("partial"))
	write(filepath.Join(store, ".index-123456"), []byte(`{"content":`))

	// distribution's layout (registry/storage/paths.go): a repository team/old tagged v0, its
	// manifest's blob, and the proxy's expiry state.
	old := []byte(`{"schemaVersion":2}`)
	od := digest.FromBytes(old)
	v2 := filepath.Join(storage, "docker", "registry", "v2")
	write(filepath.Join(v2, "blobs", "sha256", od.Encoded()[:2], od.Encoded(), "data"), old)
	write(filepath.Join(v2, "repositories", "team", "old", "_manifests", "revisions", "sha256", od.Encoded(), "link"), []byte(od.String()))
	write(filepath.Join(v2, "repositories", "team", "old", "_manifests", "tags", "v0", "current", "link"), []byte(od.String()))
	write(filepath.Join(v2, "repositories", "team", "old", "_manifests", "tags", "v0", "index", "sha256", od.Encoded(), "link"), []byte(od.String()))
	write(filepath.Join(storage, "scheduler-state.json"), []byte(`{}`))
}

// A volume the earlier release filled serves after the upgrade, with the upstream down: its
// images by tag and by digest from the store (hits, nothing fetched), its tags listed (the
// store's, and those distribution kept under docker/), its cut fill cleared. And the index this
// release writes is still the earlier release's format: a rollback reads it.
func TestVolumeOfEarlierRelease(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	img := up.push(t, "team/app")
	manifest := fetchManifest(t, up, img)
	var blobs [][]byte
	for _, b := range img.blobs {
		blobs = append(blobs, fetchBlob(t, up, img.repo, b.Digest))
	}
	up.stop()

	files := newCacheFiles(t, up.URL, "", "")
	writeEarlierVolume(t, files.storage, img.repo, img.tag,
		heldContent{b: manifest, mediaType: ocispec.MediaTypeImageManifest, refs: []digest.Digest{img.blobs[0].Digest, img.blobs[1].Digest}}, blobs...)

	cache := startCache(t, files)
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, cache.URL)
	before := cache.metrics(t)
	mustPull(t, hosts, img.byTag(up))
	mustPull(t, hosts, img.byDigest(up))
	d := delta(before, cache.metrics(t), blobHits, blobMisses, manifestHits, manifestMisses)
	if d[blobHits] != 4 || d[manifestHits] == 0 || d[blobMisses] != 0 || d[manifestMisses] != 0 {
		t.Errorf("pulls from the earlier release's volume: metric changes %v, want 4 blob hits, manifest hits, no miss", d)
	}
	if l, _ := listTags(t, cache.URL+"/v2/team/app/tags/list"); !slices.Equal(l.Tags, []string{img.tag}) {
		t.Errorf("team/app's tags with the upstream down: %q, want the store's %q", l.Tags, img.tag)
	}
	if l, _ := listTags(t, cache.URL+"/v2/team/old/tags/list"); !slices.Equal(l.Tags, []string{"v0"}) {
		t.Errorf("team/old's tags with the upstream down: %q, want distribution's v0", l.Tags)
	}
	if entries, err := os.ReadDir(filepath.Join(files.storage, "quartermaster", "tmp")); err != nil || len(entries) != 0 {
		t.Errorf("the cut fill is still there: %v %v", entries, err)
	}

	cache.stop(t)
	b, err := os.ReadFile(filepath.Join(files.storage, "quartermaster", "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The earlier release's reading of the index (store.go's types then).
	var earlier struct {
		Content map[string]struct {
			LastPull  time.Time `json:"lastPull"`
			MediaType string    `json:"mediaType"`
			Refs      []string  `json:"refs"`
		} `json:"content"`
		Repos map[string]struct {
			Tags      map[string]string    `json:"tags"`
			Manifests map[string]time.Time `json:"manifests"`
			Blobs     map[string]time.Time `json:"blobs"`
		} `json:"repos"`
	}
	if err := json.Unmarshal(b, &earlier); err != nil {
		t.Fatalf("the index after the new release: %v\n%s", err, b)
	}
	repo := earlier.Repos[img.repo]
	if repo.Tags[img.tag] != img.manifest.Digest.String() || len(repo.Blobs) != 2 || len(earlier.Content) != 3 ||
		earlier.Content[img.manifest.Digest.String()].MediaType != ocispec.MediaTypeImageManifest {
		t.Errorf("the index as the earlier release reads it: %s", b)
	}
}

// fetchBlob reads a blob from the upstream.
func fetchBlob(t *testing.T, up *upstream, repo string, d digest.Digest) []byte {
	t.Helper()
	resp, err := testClient.Get(up.URL + "/v2/" + repo + "/blobs/" + d.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || digest.FromBytes(b) != d {
		t.Fatalf("blob %s: %s %v", d, resp.Status, err)
	}
	return b
}
