package mirrorcache

import (
	"os"
	"path/filepath"
)

// Releases before the cache's own store kept content through distribution, whose filesystem
// layout is <storage>/docker/registry/v2/: blobs/<algorithm>/<2 hex>/<hex>/data, and per
// repository repositories/<name>/_manifests/tags/<tag>/current/link (the tag's digest), and
// <storage>/scheduler-state.json for its expiry. The releases since then stored nothing there
// (their distribution only answered /v2/ and tag lists, listing the tags stored there while the
// upstream was down). This release reads the tags, for the same answer; the content there was
// never served by those releases and is not by this one (their store holds what they pulled).

// legacyTagsDir is where distribution kept a repository's tags under the storage directory.
func legacyTagsDir(storageDir, repo string) string {
	return filepath.Join(storageDir, "docker", "registry", "v2", "repositories", filepath.FromSlash(repo), "_manifests", "tags")
}

// legacyTags lists the tags distribution stored for repo (none when it stored nothing), as
// distribution listed them: the tag directories.
func legacyTags(storageDir, repo string) []string {
	entries, err := os.ReadDir(legacyTagsDir(storageDir, repo))
	if err != nil {
		return nil
	}
	var tags []string
	for _, e := range entries {
		if e.IsDir() && tagName.MatchString(e.Name()) {
			tags = append(tags, e.Name())
		}
	}
	return tags
}
