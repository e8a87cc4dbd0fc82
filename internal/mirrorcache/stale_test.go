package mirrorcache

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// tagFallbackSeries is the series of tagFallbacks for reason.
func tagFallbackSeries(reason string) string {
	return fmt.Sprintf(`quartermaster_mirror_tag_fallbacks_total{reason=%q}`, reason)
}

// A pull by tag is served from the cache's last answer whatever the upstream does instead of
// answering where the tag points (429, 5xx, 401, 403, a reset connection, a connection it takes
// and never answers), and a 404 is believed, whatever the upstream did before. Each failure counts
// once as a fallback, and each change of what the upstream does is logged once.
func TestTagServedWhileUpstreamFails(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	img := up.push(t, "team/app")
	var data atomic.Pointer[front]
	cache := startCacheWith(t, newCacheFiles(t, up.URL, "", ""), Options{started: func(f *front) {
		f.tagPatience = 100 * time.Millisecond // the constant is 5 s
		data.Store(f)
	}})
	tagPath := "/v2/" + img.repo + "/manifests/" + img.tag
	getTag := func() (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, cache.URL+tagPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s from the cache: %v", tagPath, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Docker-Content-Digest")
	}
	if code, d := getTag(); code != http.StatusOK || d != img.manifest.Digest.String() {
		t.Fatalf("the tag while the upstream answers: %d %s, want 200 %s", code, d, img.manifest.Digest)
	}

	// What the upstream does to the tag's HEAD (nothing else is touched).
	onTag := func(do func(w http.ResponseWriter) bool) {
		up.setFault(func(w http.ResponseWriter, r *http.Request) bool {
			return r.Method == http.MethodHead && r.URL.Path == tagPath && do(w)
		})
	}
	status := func(code int) func(http.ResponseWriter) bool {
		return func(w http.ResponseWriter) bool { w.WriteHeader(code); return true }
	}
	reset := func(w http.ResponseWriter) bool {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return true
	}
	released := make(chan struct{})
	stall := func(w http.ResponseWriter) bool {
		<-released // takes the connection and says nothing until the test lets go
		return false
	}

	for _, tc := range []struct {
		name   string
		do     func(http.ResponseWriter) bool
		reason string // "": the 404 is believed
	}{
		{"rate limited", status(http.StatusTooManyRequests), upstreamRateLimited},
		{"unavailable", status(http.StatusServiceUnavailable), upstreamFailing},
		{"refusing the credentials", status(http.StatusUnauthorized), upstreamRefusing},
		{"denied", status(http.StatusForbidden), upstreamRefusing},
		{"not found after a refusal", status(http.StatusNotFound), ""},
		{"connection reset", reset, upstreamUnreachable},
		{"server error", status(http.StatusInternalServerError), upstreamFailing},
		{"taking the connection and never answering", stall, upstreamStalled},
		{"not found after a stall", status(http.StatusNotFound), ""},
	} {
		onTag(tc.do)
		before := cache.metrics(t)
		code, d := getTag()
		after := cache.metrics(t)
		if tc.reason == "" {
			if code != http.StatusNotFound {
				t.Errorf("%s: the cache answered %d, want the upstream's 404", tc.name, code)
			}
			continue
		}
		if code != http.StatusOK || d != img.manifest.Digest.String() {
			t.Errorf("%s: the cache answered %d %s, want 200 and its last answer %s", tc.name, code, d, img.manifest.Digest)
		}
		if n := after[tagFallbackSeries(tc.reason)] - before[tagFallbackSeries(tc.reason)]; n != 1 {
			t.Errorf("%s: %v fallbacks counted for %s, want 1", tc.name, n, tc.reason)
		}
		if state := data.Load().remote.health.current(); state != tc.reason {
			t.Errorf("%s: the upstream's state is %q, want %q", tc.name, state, tc.reason)
		}
	}
	// The stalled HEAD, let go: it was still held when its pull had been answered.
	close(released)
	up.setFault(nil)
	if code, d := getTag(); code != http.StatusOK || d != img.manifest.Digest.String() {
		t.Fatalf("the tag once the upstream answers again: %d %s", code, d)
	}
	log := cache.log.String()
	for _, said := range []string{"upstream rate_limited", "upstream failing", "upstream refusing", "upstream unreachable", "upstream stalled", "the upstream answers again"} {
		if !strings.Contains(log, said) {
			t.Errorf("the cache's log does not say %q:\n%s", said, log)
		}
	}
	if testing.Verbose() {
		t.Logf("the cache's log:\n%s", log)
	}
	if n := strings.Count(log, "upstream failing"); n != 2 {
		t.Errorf("the log says %d times that the upstream fails, want 2 (once per change to failing):\n%s", n, log)
	}
}
