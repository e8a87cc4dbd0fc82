package mirrorcache

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The rest of the registry API, beside manifests and blobs (front.go). What a client of a
// pull-through cache sends, as containerd's resolver and fetcher (the CRI's pulls) do: HEAD, then
// GET when the HEAD lacks a digest or a length, of /v2/<name>/manifests/<tag or digest> (by
// digest, a 404 makes it try /blobs/ too), GET of /v2/<name>/blobs/<digest> (with Range for a
// resumed or parallel fetch), every one with ?ns=<the image's registry> when the cache is a
// mirror in hosts.toml, which the cache ignores: it mirrors one upstream. containerd sends no
// /v2/ check before a pull; Docker and other clients do, and the readiness probe does. A client
// authenticates only when challenged, and the cache challenges no one: it has no users, the
// upstream's credentials are its own. Tools list tags. Nothing else is answered: the cache is
// read-only.

// serveAPI answers every request that is not a GET or HEAD of a manifest or a blob.
func (f *front) serveAPI(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok && r.URL.Path != "/v2" {
		registryError(w, http.StatusNotFound, "NOT_FOUND", "not the registry API: the cache serves /v2/")
		return
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	switch {
	case rest == "" && read:
		// The API version check: 200, no challenge. Independent of the upstream: it is the
		// readiness probe, and a cache serves what it holds while the upstream is down.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "2")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte("{}"))
		}
	case !read:
		w.Header().Set("Allow", "GET, HEAD")
		registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "the cache is read-only: push to the upstream")
	case strings.HasSuffix(rest, "/tags/list"):
		repo := strings.TrimSuffix(rest, "/tags/list")
		if !repoName.MatchString(repo) {
			registryError(w, http.StatusNotFound, "NAME_INVALID", "invalid repository name")
			return
		}
		f.serveTags(w, r, repo)
	default:
		// The catalog, referrers and anything else: not what a pull-through cache serves.
		registryError(w, http.StatusNotFound, "UNSUPPORTED", "the cache does not serve this")
	}
}

// serveTags answers a tag list (GET /v2/<name>/tags/list, with the spec's n and last): the
// upstream's, through the cache's one upstream client: with n, one upstream page per page asked
// (n and last passed on, the page checked and bounded here); without, the whole list. When the upstream does not answer (down,
// 5xx, refusing the cache) the list is the tags the cache holds for the repository, as for a
// pull by tag: those it resolved (its index) and those distribution stored on the volume in
// earlier releases. A 404 of the upstream is the answer: the repository is gone.
func (f *front) serveTags(w http.ResponseWriter, r *http.Request, repo string) {
	q := r.URL.Query()
	n := -1
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			registryError(w, http.StatusBadRequest, "PAGINATION_NUMBER_INVALID", "invalid number of results requested")
			return
		}
		n = v
	}
	last := q.Get("last")

	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	asked := n
	if asked > maxTagsAsked {
		asked = -1 // the whole list, paged here
	}
	tags, upstreamMore, status, err := f.remote.tags(ctx, repo, asked, last)
	switch {
	case err == nil:
	case status == http.StatusNotFound:
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "repository name not known to the upstream")
		return
	default:
		held := f.heldTags(repo)
		if len(held) == 0 {
			upstreamFailed(w, status, err)
			return
		}
		tags, upstreamMore = held, false
	}
	page, more := paginate(tags, n, last)
	// The upstream may page by fewer than n: its Link says more follow.
	more = more || (upstreamMore && len(page) > 0)
	if more {
		next := r.URL.Query()
		next.Set("n", strconv.Itoa(n))
		next.Set("last", page[len(page)-1])
		w.Header().Set("Link", `<`+(&url.URL{Path: r.URL.Path, RawQuery: next.Encode()}).String()+`>; rel="next"`)
	}
	w.Header().Set("Content-Type", "application/json")
	body, _ := json.Marshal(struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}{repo, page})
	body = append(body, '\n')
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
}

// heldTags are the tags the cache holds for repo, sorted: those its index has, and those of the
// volume's earlier releases (legacy.go).
func (f *front) heldTags(repo string) []string {
	tags := f.store.tags(repo)
	tags = append(tags, legacyTags(f.root, repo)...)
	slices.Sort(tags)
	return slices.Compact(tags)
}

// paginate returns the page of tags a request with n (-1: all) and last asks for, in lexical
// order, and whether more follow: the entries after last, at most n of them.
func paginate(tags []string, n int, last string) (page []string, more bool) {
	sorted := slices.Clone(tags)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if last != "" {
		i, found := slices.BinarySearch(sorted, last)
		if found {
			i++
		}
		sorted = sorted[i:]
	}
	if n < 0 || n >= len(sorted) {
		return append([]string{}, sorted...), false
	}
	return sorted[:n], n > 0
}
