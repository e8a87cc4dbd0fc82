package mirrorcache

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// call sends one request to the cache and returns its status, headers and body.
func call(t *testing.T, method, target string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return resp.StatusCode, resp.Header, b
}

// errorCode is the first code of a registry error body.
func errorCode(b []byte) string {
	var e struct{ Errors []struct{ Code string } }
	if json.Unmarshal(b, &e) != nil || len(e.Errors) == 0 {
		return ""
	}
	return e.Errors[0].Code
}

// tagList is a tag list answer.
type tagList struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// listTags reads a tag list at target and returns it with its Link header.
func listTags(t *testing.T, target string) (tagList, string) {
	t.Helper()
	status, h, b := call(t, http.MethodGet, target)
	if status != http.StatusOK || h.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %d %s %q, want 200 application/json", target, status, h.Get("Content-Type"), b)
	}
	var l tagList
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("GET %s: %v: %q", target, err, b)
	}
	return l, h.Get("Link")
}

// walkTags follows a tag list's Link headers from first to the end, as a client does, and returns
// every tag and the pages' sizes.
func walkTags(t *testing.T, cacheURL, first string) (all []string, pages []int) {
	t.Helper()
	next := first
	for range 100 {
		l, link := listTags(t, cacheURL+next)
		all = append(all, l.Tags...)
		pages = append(pages, len(l.Tags))
		if link == "" {
			return all, pages
		}
		target, rel, ok := strings.Cut(link, ">; ")
		if !ok || rel != `rel="next"` || !strings.HasPrefix(target, "</v2/") {
			t.Fatalf("Link %q: want </v2/…>; rel=\"next\"", link)
		}
		next = strings.TrimPrefix(target, "<")
	}
	t.Fatalf("more than 100 pages from %s", first)
	return nil, nil
}

// The registry API beside manifests and blobs: the /v2/ check, tag lists with the spec's
// pagination (through the cache's one upstream client, token-authenticated here), and the
// answers of a read-only cache.
func TestRegistryAPI(t *testing.T) {
	up := startUpstream(t, authToken, "token-secret", false)
	img := up.push(t, "team/app")
	manifest := fetchManifest(t, up, img)
	tags := []string{"a", "b", "c", "d", testTag}
	for _, tag := range tags[:4] {
		up.do(t, http.MethodPut, up.URL+"/v2/team/app/manifests/"+tag, ocispec.MediaTypeImageManifest, manifest, http.StatusCreated)
	}
	up.requests()
	cache := startCache(t, newCacheFiles(t, up.URL, upstreamUser, "token-secret"))

	t.Run("version check", func(t *testing.T) {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			status, h, b := call(t, method, cache.URL+"/v2/")
			want := "{}"
			if method == http.MethodHead {
				want = ""
			}
			if status != http.StatusOK || string(b) != want || h.Get("Content-Type") != "application/json" ||
				h.Get("Docker-Distribution-API-Version") != "registry/2.0" || h.Get("WWW-Authenticate") != "" ||
				h.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("%s /v2/: %d %v %q", method, status, h, b)
			}
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("the /v2/ check reached the upstream: %q", seen)
		}
	})

	t.Run("tag list", func(t *testing.T) {
		l, link := listTags(t, cache.URL+"/v2/team/app/tags/list")
		if l.Name != "team/app" || !slices.Equal(l.Tags, tags) || link != "" {
			t.Errorf("the whole list: %+v Link %q, want %q and no Link", l, link, tags)
		}
		if seen := up.requests(); !slices.Contains(seen, "GET /v2/team/app/tags/list") || !slices.Contains(seen, "GET /token") {
			t.Errorf("the upstream saw %q, want its token realm asked and its tag list", seen)
		}
		up.requests()
		all, pages := walkTags(t, cache.URL, "/v2/team/app/tags/list?n=2")
		if !slices.Equal(all, tags) || !slices.Equal(pages, []int{2, 2, 1}) {
			t.Errorf("pages of 2: %q in pages %v, want %q in 2, 2, 1", all, pages, tags)
		}
		if n := count(up.requests(), "GET /v2/team/app/tags/list"); n != 3 {
			t.Errorf("pages of 2: %d upstream tag list requests, want one per page (3)", n)
		}
		if l, link := listTags(t, cache.URL+"/v2/team/app/tags/list?n=2&last=b"); !slices.Equal(l.Tags, []string{"c", "d"}) ||
			link != `</v2/team/app/tags/list?last=d&n=2>; rel="next"` {
			t.Errorf("n=2 last=b: %q Link %q", l.Tags, link)
		}
		// last need not be a tag: the entries after it in lexical order.
		if l, link := listTags(t, cache.URL+"/v2/team/app/tags/list?last=bb"); !slices.Equal(l.Tags, []string{"c", "d", testTag}) || link != "" {
			t.Errorf("last=bb: %q Link %q", l.Tags, link)
		}
		if l, link := listTags(t, cache.URL+"/v2/team/app/tags/list?n=0"); len(l.Tags) != 0 || link != "" || l.Tags == nil {
			t.Errorf("n=0: %#v Link %q, want [] and no Link", l.Tags, link)
		}
		if l, link := listTags(t, cache.URL+"/v2/team/app/tags/list?n=5"); !slices.Equal(l.Tags, tags) || link != "" {
			t.Errorf("n=5 (all of them): %q Link %q, want no Link", l.Tags, link)
		}
		for target, want := range map[string]struct {
			status int
			code   string
		}{
			"/v2/team/app/tags/list?n=-1":  {http.StatusBadRequest, "PAGINATION_NUMBER_INVALID"},
			"/v2/team/app/tags/list?n=two": {http.StatusBadRequest, "PAGINATION_NUMBER_INVALID"},
			"/v2/team/nothing/tags/list":   {http.StatusNotFound, "NAME_UNKNOWN"},
			"/v2/Team/App/tags/list":       {http.StatusNotFound, "NAME_INVALID"},
		} {
			if status, _, b := call(t, http.MethodGet, cache.URL+target); status != want.status || errorCode(b) != want.code {
				t.Errorf("GET %s: %d %q, want %d %s", target, status, b, want.status, want.code)
			}
		}
	})

	t.Run("an upstream that pages its list", func(t *testing.T) {
		// An upstream that pages by 3 whatever n says: a client asking for the whole list gets it
		// at once (the cache follows the upstream's Link headers, relative as distribution writes
		// them or absolute on the upstream's host); a client asking for pages of 4 gets the
		// upstream's pages of 3, each linked to the next, every tag once.
		many := []string{"t0", "t1", "t2", "t3", "t4", "t5", "t6"}
		var (
			mu    sync.Mutex
			asked []string
		)
		up.setFault(func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path != "/v2/team/paged/tags/list" {
				return false
			}
			mu.Lock()
			asked = append(asked, r.URL.RawQuery)
			mu.Unlock()
			from := 0
			if last := r.URL.Query().Get("last"); last != "" {
				from = slices.Index(many, last) + 1
			}
			to := min(from+3, len(many))
			if to < len(many) {
				next := fmt.Sprintf("/v2/team/paged/tags/list?n=3&last=%s", many[to-1])
				if from > 0 {
					next = up.URL + next
				}
				w.Header().Set("Link", "<"+next+`>; rel="next"`)
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(tagList{Name: "team/paged", Tags: many[from:to]})
			return true
		})
		defer up.setFault(nil)
		all, pages := walkTags(t, cache.URL, "/v2/team/paged/tags/list")
		if !slices.Equal(all, many) || !slices.Equal(pages, []int{7}) {
			t.Errorf("the whole list: %q in pages %v, want %q in one", all, pages, many)
		}
		mu.Lock()
		asked = nil
		mu.Unlock()
		all, pages = walkTags(t, cache.URL, "/v2/team/paged/tags/list?n=4")
		if !slices.Equal(all, many) || !slices.Equal(pages, []int{3, 3, 1}) {
			t.Errorf("pages of 4: %q in pages %v, want %q in 3, 3, 1", all, pages, many)
		}
		// One upstream request per page, n+1 asked (one more says whether others follow).
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"n=5", "last=t2&n=5", "last=t5&n=5"}; !slices.Equal(asked, want) {
			t.Errorf("the upstream was asked %q, want %q", asked, want)
		}
	})

	t.Run("read-only", func(t *testing.T) {
		up.requests()
		for _, r := range []struct{ method, path string }{
			{http.MethodPost, "/v2/team/app/blobs/uploads/"},
			{http.MethodPut, "/v2/team/app/manifests/" + testTag},
			{http.MethodDelete, "/v2/team/app/manifests/" + img.manifest.Digest.String()},
			{http.MethodDelete, "/v2/team/app/blobs/" + img.blobs[1].Digest.String()},
			{http.MethodPatch, "/v2/team/app/blobs/uploads/x"},
		} {
			if status, _, b := call(t, r.method, cache.URL+r.path); status != http.StatusMethodNotAllowed || errorCode(b) != "UNSUPPORTED" {
				t.Errorf("%s %s: %d %q, want 405 UNSUPPORTED", r.method, r.path, status, b)
			}
		}
		for _, path := range []string{"/v2/_catalog", "/v2/team/app/referrers/" + img.manifest.Digest.String(), "/v3/", "/metrics"} {
			if status, _, b := call(t, http.MethodGet, cache.URL+path); status != http.StatusNotFound {
				t.Errorf("GET %s: %d %q, want 404", path, status, b)
			}
		}
		if seen := up.requests(); len(seen) != 0 {
			t.Errorf("refused requests reached the upstream: %q", seen)
		}
	})

	t.Run("upstream down", func(t *testing.T) {
		// Pulled by tag through the cache: the tags it holds are its list while the upstream is
		// down, as the manifest it serves; a repository it holds nothing of fails.
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, cache.URL)
		for _, tag := range []string{"b", testTag} {
			mustPull(t, hosts, up.Host+"/team/app:"+tag)
		}
		up.stop()
		l, link := listTags(t, cache.URL+"/v2/team/app/tags/list")
		if !slices.Equal(l.Tags, []string{"b", testTag}) || link != "" {
			t.Errorf("with the upstream down: %q Link %q, want the tags pulled through the cache", l.Tags, link)
		}
		if l, link := listTags(t, cache.URL+"/v2/team/app/tags/list?n=1"); !slices.Equal(l.Tags, []string{"b"}) ||
			link != `</v2/team/app/tags/list?last=b&n=1>; rel="next"` {
			t.Errorf("with the upstream down, n=1: %q Link %q", l.Tags, link)
		}
		if status, _, b := call(t, http.MethodGet, cache.URL+"/v2/team/other/tags/list"); status != http.StatusBadGateway || errorCode(b) != "UNAVAILABLE" {
			t.Errorf("a repository the cache holds nothing of, upstream down: %d %q, want 502 UNAVAILABLE", status, b)
		}
	})
}

// fetchManifest reads img's manifest from the upstream as pushed.
func fetchManifest(t *testing.T, up *upstream, img testImage) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, up.URL+"/v2/"+img.repo+"/manifests/"+img.manifest.Digest.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
	req.Header.Set("Authorization", "Bearer "+up.token)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the manifest: %s %v", resp.Status, err)
	}
	return b
}

func TestNextLink(t *testing.T) {
	for h, want := range map[string]string{
		`</v2/r/tags/list?n=2&last=b>; rel="next"`:              "/v2/r/tags/list?n=2&last=b",
		`<https://r.example/v2/r/tags/list?last=b>; rel=next`:   "https://r.example/v2/r/tags/list?last=b",
		`</a>; rel="prev", </b>; rel="next"`:                    "/b",
		`</a>; title="x, y"; rel="prev", </b>; REL="last next"`: "/b",
		`</a>; rel="prev"`: "",
		``:                 "",
		`garbage`:          "",
		`</v2/r/tags/list?n=2&last=b>; rel="next"; type="application/json"`: "/v2/r/tags/list?n=2&last=b",
	} {
		if got := nextLink(h); got != want {
			t.Errorf("nextLink(%q) = %q, want %q", h, got, want)
		}
	}
}

func TestPaginate(t *testing.T) {
	tags := []string{"c", "a", "b", "a"}
	for _, tc := range []struct {
		n    int
		last string
		want []string
		more bool
	}{
		{-1, "", []string{"a", "b", "c"}, false},
		{2, "", []string{"a", "b"}, true},
		{2, "b", []string{"c"}, false},
		{3, "", []string{"a", "b", "c"}, false},
		{0, "", []string{}, false},
		{1, "c", []string{}, false},
		{1, "0", []string{"a"}, true},
	} {
		got, more := paginate(tags, tc.n, tc.last)
		if !slices.Equal(got, tc.want) || more != tc.more || got == nil {
			t.Errorf("paginate(n=%d, last=%q) = %#v %v, want %q %v", tc.n, tc.last, got, more, tc.want, tc.more)
		}
	}
}
