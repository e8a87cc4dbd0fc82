package mirrorcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
)

// front is the cache's registry: it answers GET and HEAD of manifests and blobs from its store
// or a coalesced fill, and every other request itself (api.go). Unlike distribution's proxy,
// which the cache embedded before, it never sends a request for a blob being fetched straight to
// the upstream, never ties a fill to the first client, and never expires shared blobs while other
// repositories still use them (docs/mirrors.md, The cache).
type front struct {
	remote *remote
	peers  *peers // nil: no other replicas
	store  *store
	ttl    time.Duration
	root   string // the storage directory: the store's and distribution's (legacy.go)
	log    logr.Logger

	ctx    context.Context // the fills' context: the cache's, never a client's
	cancel context.CancelFunc
	wg     sync.WaitGroup // the fills, the warms and the reporter
	loop   sync.WaitGroup // run: it starts warms, so it ends before wg is waited for

	mu    sync.Mutex
	fills map[digest.Digest]*fill
	tags  map[string]*tagLookup
	// tagPatience is how long a pull by tag waits for the upstream before a cached answer serves
	// (the constant; tests shorten it).
	tagPatience time.Duration

	// volume is the storage volume's size and free space as df counts them (statfs; tests make
	// them up), and
	// reserve what a fill leaves free of it (reserveBytes; tests lower it).
	volume  func() (total, free uint64, err error)
	reserve uint64
	// highWater and lowWater are the volume's eviction marks, as fractions of it used (bound).
	highWater, lowWater float64

	// pinsPath is the pins file; pins what it said last (nil: nothing pinned); pinsSeen the stat
	// of the file last read, read again only when it changed (the kubelet swaps in a new file, a
	// test writes in place: a new modification time). The loop alone reads the file and writes
	// pinsSeen, pinsHash, pinnedBytesAt, pinnedBytes and pinnedOver.
	pinsPath      string
	pins          atomic.Pointer[pins]
	pinsSeen      fs.FileInfo
	pinsHash      string // mirror.PinsHash of the file read last
	pinnedBytesAt time.Time
	pinnedBytes   uint64
	pinnedOver    bool
	warmer        *warmer
	warmed        atomic.Bool // a warm ended well since the pinned content was counted
	// reporter, when set, notes the pins' state on the cache's Pod (report.go).
	reporter *reporter
	// A write the volume refused: fills pass through until then (unix nanoseconds), as when
	// the volume reports itself full.
	refusedUntil atomic.Int64
}

// refusedRetry is how long after a refused write the cache stops trying to store.
const refusedRetry = time.Minute

// room is the volume's free space for a fill, beyond what is kept free (reserve, but at most half
// of what lies above the high-water mark: on a small volume a fixed reserve would stop fills from
// storing before the volume reaches the mark, and eviction would never make room): none for a
// while after a refused write.
func (f *front) room() (uint64, error) {
	if time.Now().UnixNano() < f.refusedUntil.Load() {
		return 0, nil
	}
	total, free, err := f.volume()
	reserve := min(f.reserve, uint64((1-f.highWater)*float64(total)/2))
	return free - min(free, reserve), err
}

// bound deletes the least recently pulled content while the volume is above its high-water mark,
// until it is at its low-water mark (f.highWater, f.lowWater: the mirror's spec.eviction; nginx's
// proxy_cache max_size, as marks of the volume rather than a size: the claim is the size).
// Pass-through stays the last resort of a fill the volume has no room for even so.
func (f *front) bound() {
	highWater, lowWater := f.highWater, f.lowWater
	total, free, err := f.volume()
	if err != nil || total == 0 || free > total {
		return
	}
	used := total - free
	above := float64(used) > highWater*float64(total)
	var pinned map[digest.Digest]bool
	if p := f.pins.Load(); p != nil && (above || f.warmed.Swap(false) || time.Since(f.pinnedBytesAt) >= pinnedBytesEvery) {
		pinned = f.store.pinnedSet(p)
		f.countPinned(pinned, total)
	}
	if !above {
		return
	}
	need := used - uint64(lowWater*float64(total))
	n, freed := f.store.evict(need, func(d digest.Digest) bool { return pinned[d] })
	if n == 0 {
		return // nothing left to delete: fills pass through (store_full says so)
	}
	evicted.Add(float64(n))
	evictedBytes.Add(float64(freed))
	f.log.Info("cache volume above its high-water mark: least recently pulled content deleted",
		"used", used, "size", total, "highWater", highWater, "lowWater", lowWater, "deleted", n, "freed", freed, "pinned", len(pinned))
}

// tagLookup is one upstream HEAD of a tag that concurrent pulls of the tag share.
type tagLookup struct {
	done   chan struct{}
	began  time.Time
	d      digest.Digest
	status int // the upstream's status, 0 when it did not answer
	err    error
}

func newFront(r *remote, p *peers, s *store, ttl time.Duration, storageDir string, log logr.Logger) *front {
	ctx, cancel := context.WithCancel(context.Background())
	root := s.root
	return &front{
		remote: r, peers: p, store: s, ttl: ttl, root: storageDir, log: log, ctx: ctx, cancel: cancel,
		fills: map[digest.Digest]*fill{}, tags: map[string]*tagLookup{}, tagPatience: tagPatience, reserve: reserveBytes,
		highWater: mirror.DefaultHighWater / 100.0, lowWater: mirror.DefaultLowWater / 100.0, warmer: newWarmer(),
		volume: func() (uint64, uint64, error) {
			var st syscall.Statfs_t
			if err := syscall.Statfs(root, &st); err != nil {
				return 0, 0, err
			}
			// As df counts: the size is what is used plus what the cache may still use (the
			// blocks reserved for root are neither), so "used" is df's Use%.
			bsize := uint64(st.Bsize) //nolint:gosec // block size is positive
			return (st.Blocks - st.Bfree + st.Bavail) * bsize, st.Bavail * bsize, nil
		},
	}
}

// flushInterval is how often the volume is held under its high-water mark (bound), the index
// written (store.flush) and the peer gauges set.
const flushInterval = 2 * time.Second

// run sweeps expired content and writes the index until close.
func (f *front) run() {
	interval := min(max(f.ttl/10, time.Second), 5*time.Minute)
	sweep := time.NewTicker(interval)
	flush := time.NewTicker(flushInterval)
	defer sweep.Stop()
	defer flush.Stop()
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-sweep.C:
			f.sweep()
		case <-flush.C:
			if f.peers != nil {
				up, down := f.peers.set.Counts()
				peersKnown.WithLabelValues("up").Set(float64(up))
				peersKnown.WithLabelValues("down").Set(float64(down))
			}
			f.loadPins()
			warms := f.warmPins()
			f.bound()
			f.report(warms)
			if err := f.store.flush(); err != nil {
				f.log.Error(err, "writing the cache index")
			}
		}
	}
}

func (f *front) sweep() {
	if n := f.store.sweep(f.ttl, f.store.pinnedSet(f.pins.Load())); n > 0 {
		expired.Add(float64(n))
		f.log.Info("cache content expired", "deleted", n)
	}
}

// close stops the fills (their partial files are removed) and writes the index.
func (f *front) close() error {
	f.cancel()
	f.loop.Wait()
	f.wg.Wait()
	return f.store.flush()
}

// repoName is distribution's repository name grammar.
var repoName = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$`)

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	repo, kind, ref, ok := contentPath(r)
	if !ok {
		f.serveAPI(w, r)
		return
	}
	if kind == "/blobs/" {
		d, err := digest.Parse(ref)
		if err != nil {
			registryError(w, http.StatusBadRequest, "DIGEST_INVALID", "invalid digest")
			return
		}
		f.serve(w, r, repo, d, false, false, false)
		return
	}
	f.serveManifest(w, r, repo, ref)
}

// contentPath reads a GET or HEAD of /v2/<repo>/blobs/<ref> or /v2/<repo>/manifests/<ref>; kind
// is "/blobs/" or "/manifests/". Anything else is not the data path's.
func contentPath(r *http.Request) (repo, kind, ref string, ok bool) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return "", "", "", false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v2/")
	if !ok {
		return "", "", "", false
	}
	for _, kind := range []string{"/blobs/", "/manifests/"} {
		i := strings.LastIndex(rest, kind)
		if i <= 0 {
			continue
		}
		repo, ref := rest[:i], rest[i+len(kind):]
		if !repoName.MatchString(repo) || ref == "" || strings.Contains(ref, "/") {
			return "", "", "", false
		}
		return repo, kind, ref, true
	}
	return "", "", "", false
}

func (f *front) serveManifest(w http.ResponseWriter, r *http.Request, repo, ref string) {
	if d, err := digest.Parse(ref); err == nil {
		f.serve(w, r, repo, d, true, false, false)
		return
	}
	if !tagName.MatchString(ref) {
		registryError(w, http.StatusBadRequest, "TAG_INVALID", "invalid tag")
		return
	}
	// A tag moves: the upstream says where it points now (a HEAD, shared by concurrent pulls).
	// When it cannot (it refuses, fails or is not reached, or has said nothing within
	// tagPatience), the cache's last answer serves; a 404 is believed (docs/mirrors.md, Tags).
	l := f.lookupTag(repo, ref)
	patience := time.NewTimer(f.tagPatience)
	defer patience.Stop()
	select {
	case <-l.done:
	case <-r.Context().Done():
		return
	case <-patience.C:
		if d, ok := f.cachedTag(r.Context(), repo, ref); ok {
			f.remote.health.set(upstreamStalled, fmt.Sprintf("HEAD of tag %s:%s: no answer within %s, the cache's last answer serves", repo, ref, f.tagPatience), nil)
			tagFallbacks.WithLabelValues(upstreamStalled).Inc()
			f.serve(w, r, repo, d, true, false, false)
			return
		}
		select { // nothing to serve instead: wait for the upstream's answer, or its lookup's end
		case <-l.done:
		case <-r.Context().Done():
			return
		}
	}
	d := l.d
	confirmed := l.err == nil && l.status == http.StatusOK
	switch {
	case confirmed:
		f.store.setTag(repo, ref, d)
	case l.status == http.StatusNotFound:
		registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "manifest unknown to the upstream")
		return
	default:
		cached, ok := f.cachedTag(r.Context(), repo, ref)
		if !ok {
			upstreamFailed(w, l.status, l.err)
			return
		}
		tagFallbacks.WithLabelValues(l.failure()).Inc()
		d = cached
	}
	f.serve(w, r, repo, d, true, confirmed, false)
}

// tagPatience is how long a pull by tag waits for the upstream's answer before the cache's last
// answer serves (docs/mirrors.md promises 5 s). Without a last answer, the pull waits for the
// lookup (tagLookupTimeout).
const tagPatience = 5 * time.Second

// tagLookupTimeout bounds a tag's lookup: an upstream that takes the connection and never answers
// holds it this long, and with it the pulls that have no cached answer.
const tagLookupTimeout = 30 * time.Second

// cachedTag is where the cache last saw the tag point: in this pod's store, or another replica's
// (the Service sends a node's pulls to any pod).
func (f *front) cachedTag(ctx context.Context, repo, tag string) (digest.Digest, bool) {
	if d, ok := f.store.tag(repo, tag); ok {
		return d, true
	}
	if f.peers != nil {
		return f.peers.tag(ctx, repo, tag)
	}
	return "", false
}

// failure is what the upstream did instead of answering the lookup (a tagFallbacks reason, by
// the upstream state's one rule, stateOf).
func (l *tagLookup) failure() string {
	switch {
	case l.err != nil && errors.Is(l.err, context.DeadlineExceeded):
		return stateOf(resultTimeout, 0)
	case l.err != nil:
		return stateOf(resultUnreachable, 0)
	}
	return stateOf(statusResult(l.status), l.status)
}

var tagName = regexp.MustCompile(`^[\w][\w.-]{0,127}$`)

// lookupTag starts the upstream's lookup of repo:tag, or joins the one in flight if it began less
// than tagPatience ago; its done closes when it has ended. A lookup the upstream has held longer
// is not joined: a pull gets an answer the upstream gave after the pull began, or the cache's own
// (so what a pull gets never depends on an earlier stall: a tag the upstream now says is gone is
// 404, whether or not a lookup is still stuck).
func (f *front) lookupTag(repo, tag string) *tagLookup {
	key := repo + ":" + tag
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.tags[key]; l != nil && now.Sub(l.began) < f.tagPatience {
		coalesced.WithLabelValues(typeManifest).Inc()
		return l
	}
	l := &tagLookup{done: make(chan struct{}), began: now}
	f.tags[key] = l
	go func() {
		defer func() {
			f.mu.Lock()
			if f.tags[key] == l {
				delete(f.tags, key)
			}
			f.mu.Unlock()
			close(l.done)
		}()
		ctx, cancel := context.WithTimeout(f.ctx, tagLookupTimeout)
		defer cancel()
		resp, err := f.remote.do(ctx, http.MethodHead, repo, "manifests", tag)
		if err != nil {
			l.err = err
			return
		}
		drain(resp)
		l.status = resp.StatusCode
		if resp.StatusCode == http.StatusOK {
			l.d, l.err = digest.Parse(resp.Header.Get("Docker-Content-Digest"))
		}
	}()
	return l
}

// serve answers a request for content d of repo: from the store when repo may have it, else
// after the upstream confirms repo has it, else from a fill. confirmed: the upstream has just
// said repo has d. fromPeer: another replica asks (on the peer port), so the content comes
// from this cache or the upstream, never from a third replica.
func (f *front) serve(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest, manifest, confirmed, fromPeer bool) {
	known := confirmed || f.store.has(repo, d)
	if known {
		if f.serveStored(w, r, repo, d, manifest, fromPeer) {
			return
		}
	}
	if r.Method == http.MethodHead && !manifest {
		// A blob HEAD that the store cannot answer: the upstream's, no body fetched.
		f.confirm(w, r, repo, d, manifest)
		return
	}
	stored := f.store.content(d) != nil
	f.mu.Lock()
	fl, filling := f.fills[d]
	f.mu.Unlock()
	if filling && fl.repo == repo {
		known = true // the fill fetches it for this repository
	}
	if !known && (stored || filling) {
		// Content held (or being fetched) for another repository: the upstream must say this
		// repository has it (a HEAD, no body).
		if !f.confirm(w, r, repo, d, manifest) {
			return
		}
		if stored && f.serveStored(w, r, repo, d, manifest, fromPeer) {
			return
		}
	}
	fl, leader := f.join(repo, d, manifest, fromPeer)
	if fromPeer && fl != nil && !leader {
		fl.sendUpstream()
	}
	if fl == nil {
		// Committed between the checks.
		if f.serveStored(w, r, repo, d, manifest, fromPeer) {
			return
		}
		registryError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "content vanished; retry")
		return
	}
	result := resultCoalesced
	switch {
	case fromPeer:
		result = "" // the asking replica counted its client's request (peer_served_requests_total counts this one)
	case leader:
		result = resultMiss
	}
	f.serveFill(w, r, repo, fl, result)
}

// confirm asks the upstream (HEAD, no body) whether repo has d. For a HEAD request it also
// writes the answer. It reports whether the request goes on.
func (f *front) confirm(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest, manifest bool) bool {
	path := pathOf(manifest)
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	resp, err := f.remote.do(ctx, http.MethodHead, repo, path, d.String())
	if err != nil {
		upstreamFailed(w, 0, err)
		return false
	}
	drain(resp)
	if resp.StatusCode != http.StatusOK {
		upstreamFailed(w, resp.StatusCode, nil)
		return false
	}
	if r.Method == http.MethodHead && !manifest {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Docker-Content-Digest", d.String())
		if resp.ContentLength >= 0 {
			w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
		}
		w.WriteHeader(http.StatusOK)
		return false
	}
	return true
}

// join returns d's fill, starting it when none runs (leader); nil when d was committed meanwhile.
// fromPeer: another replica asks, so a fill started here reads only from the upstream.
func (f *front) join(repo string, d digest.Digest, manifest, fromPeer bool) (fl *fill, leader bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.fills[d]; fl != nil {
		return fl, false
	}
	// A fill is removed from the map only after its commit, so content missing here is not
	// being fetched: unless it was committed just now.
	if file := f.store.open(d); file != nil {
		file.Close()
		return nil, false
	}
	fl = newFill(d, repo, manifest, fromPeer, f.log)
	f.fills[d] = fl
	// In flight from the moment a request can join it until none can: a request after the gauge
	// drops to 0 is served from the store (a hit), never from this fill.
	fillsInFlight.Inc()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if fl.run(f.ctx, origins{remote: f.remote, peers: f.peers}, f.store, repo, f.room) {
			f.refusedUntil.Store(time.Now().Add(refusedRetry).UnixNano())
		}
		f.mu.Lock()
		delete(f.fills, d)
		f.mu.Unlock()
		fillsInFlight.Dec()
	}()
	return fl, true
}

// serveStored serves committed content, a hit (counted unless another replica asks: its client's
// request is counted there); false when there is none (expired or never fetched).
func (f *front) serveStored(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest, manifest, fromPeer bool) bool {
	file := f.store.open(d)
	if file == nil {
		return false
	}
	// Counted before the answer: a client that got it sees it counted.
	if !fromPeer {
		cacheRequests.WithLabelValues(kindOf(manifest), resultHit).Inc()
	}
	defer file.Close()
	meta := f.store.content(d)
	if meta == nil {
		meta = &contentMeta{}
	}
	f.store.pulled(repo, d, manifest)
	setContentHeaders(w, d, manifest, meta.MediaType)
	// Range, HEAD and conditional requests; sendfile from the file.
	http.ServeContent(w, r, "", time.Time{}, file)
	return true
}

func setContentHeaders(w http.ResponseWriter, d digest.Digest, manifest bool, mediaType string) {
	h := w.Header()
	if !manifest || mediaType == "" {
		mediaType = "application/octet-stream"
	}
	h.Set("Content-Type", mediaType)
	h.Set("Docker-Content-Digest", d.String())
	h.Set("Etag", `"`+d.String()+`"`)
	h.Set("Accept-Ranges", "bytes")
	if !manifest {
		h.Set("Cache-Control", "max-age=31536000")
	}
}

// serveFill answers from a fill: headers once the upstream answered, then the bytes as they
// arrive. A fill that fails after the headers aborts the connection: a client never gets a short
// body that looks complete.
func (f *front) serveFill(w http.ResponseWriter, r *http.Request, repo string, fl *fill, result string) {
	fl.mu.Lock()
	fl.waitLocked(r.Context(), func() bool { return fl.ready })
	ready, noSpace, ferr, status, size, mediaType := fl.ready, fl.noSpace, fl.err, fl.status, fl.size, fl.mediaType
	fl.mu.Unlock()
	// Counted once, as it is served: a fill the volume had no room for is passed through.
	if noSpace && result != "" {
		result = resultPassThrough
	}
	if result != "" {
		kind := kindOf(fl.manifest)
		cacheRequests.WithLabelValues(kind, result).Inc()
		if result == resultCoalesced {
			coalesced.WithLabelValues(kind).Inc()
		}
	}
	switch {
	case !ready:
		return // the client left
	case noSpace:
		f.passThrough(w, r, repo, fl.d, fl.manifest)
		return
	case ferr != nil:
		// Failed before this request wrote anything: say so, rather than start a 200 to cut.
		upstreamFailed(w, status, ferr)
		return
	}
	f.store.pulled(repo, fl.d, fl.manifest)
	setContentHeaders(w, fl.d, fl.manifest, mediaType)
	from, to, partial := int64(0), size, false
	if size >= 0 {
		if rg, ok := parseRange(r.Header.Get("Range"), size); ok {
			from, to, partial = rg[0], rg[1], true
		}
	}
	if to >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(to-from, 10))
	}
	code := http.StatusOK
	if partial {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to-1, size))
		code = http.StatusPartialContent
	}
	sendHeader(w, code)
	if r.Method == http.MethodHead {
		return
	}
	if err := fl.tail(r.Context(), w, from, to); err != nil {
		if r.Context().Err() == nil {
			f.log.Error(err, "aborting a response: its fill failed", "digest", fl.d.String())
		}
		panic(http.ErrAbortHandler)
	}
}

// passThrough streams d from the upstream without storing it: the volume has no room.
func (f *front) passThrough(w http.ResponseWriter, r *http.Request, repo string, d digest.Digest, manifest bool) {
	path := pathOf(manifest)
	resp, err := f.remote.do(r.Context(), r.Method, repo, path, d.String())
	if err != nil {
		upstreamFailed(w, 0, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		upstreamFailed(w, resp.StatusCode, nil)
		return
	}
	setContentHeaders(w, d, manifest, resp.Header.Get("Content-Type"))
	if resp.ContentLength >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	sendHeader(w, http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	// As from a fill, the last byte goes only once the digest is checked.
	verifier := d.Verifier()
	held := &holdLast{w: w}
	n, err := io.Copy(io.MultiWriter(held, verifier), &source{body: resp.Body, bytes: upstreamBytes.WithLabelValues(kindOf(manifest))})
	if err != nil || (resp.ContentLength >= 0 && n != resp.ContentLength) || !verifier.Verified() {
		panic(http.ErrAbortHandler)
	}
	if err := held.release(); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// sendHeader sends the status and headers now, before the body: a response aborted before its
// first byte (its fill failed just after the status was chosen) is then a 200 the client sees
// cut, not a connection closed with no answer at all (net/http holds the headers until a write).
func sendHeader(w http.ResponseWriter, status int) {
	w.WriteHeader(status)
	_ = http.NewResponseController(w).Flush()
}

// holdLast writes all but the last byte it was given; release writes that one.
type holdLast struct {
	w    io.Writer
	last []byte
}

func (h *holdLast) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(h.last) > 0 {
		if _, err := h.w.Write(h.last); err != nil {
			return 0, err
		}
	}
	if _, err := h.w.Write(p[:len(p)-1]); err != nil {
		return 0, err
	}
	h.last = append(h.last[:0], p[len(p)-1])
	return len(p), nil
}

func (h *holdLast) release() error {
	_, err := h.w.Write(h.last)
	return err
}

// parseRange reads one "bytes=a-b", "bytes=a-" or "bytes=-n" range as [from, to); anything
// else is served whole, which HTTP allows.
func parseRange(h string, size int64) ([2]int64, bool) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return [2]int64{}, false
	}
	a, b, ok := strings.Cut(strings.TrimSpace(spec), "-")
	if !ok {
		return [2]int64{}, false
	}
	if a == "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return [2]int64{}, false
		}
		return [2]int64{max(size-n, 0), size}, true
	}
	from, err := strconv.ParseInt(a, 10, 64)
	if err != nil || from < 0 || from >= size {
		return [2]int64{}, false
	}
	to := size
	if b != "" {
		last, err := strconv.ParseInt(b, 10, 64)
		if err != nil || last < from {
			return [2]int64{}, false
		}
		to = min(last+1, size)
	}
	return [2]int64{from, to}, true
}

// upstreamFailed answers a request the upstream could not serve: its 404 as the registry's
// "unknown", a refusal or no answer as 502 (distribution answers the same way).
func upstreamFailed(w http.ResponseWriter, status int, err error) {
	switch status {
	case http.StatusInsufficientStorage: // the cache's volume, not the upstream
		registryError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "the cache could not store the content: retry")
	case http.StatusNotFound:
		registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", "unknown to the upstream")
	case http.StatusUnauthorized, http.StatusForbidden:
		registryError(w, http.StatusBadGateway, "UNAVAILABLE", "the upstream refused the cache")
	default:
		msg := "the upstream is unavailable"
		if err != nil {
			msg += ": " + err.Error()
		}
		registryError(w, http.StatusBadGateway, "UNAVAILABLE", msg)
	}
}

func registryError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`+"\n", code, msg)
}
