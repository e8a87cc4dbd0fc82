package mirrorcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"
)

// A fill fetches one digest (from the peer that owns it, another peer, or the upstream) into a
// temporary file of the store, once, however many requests want it: the first request starts it,
// every request (the first included) tails
// the file as it grows, and the fill runs on the cache's own context, so no client leaving stops
// it. It commits (rename into blobs/) only after the digest and length were checked; on any
// failure the file is removed and every request still reading is aborted.
type fill struct {
	d        digest.Digest
	repo     string // the repository it is fetched for
	log      logr.Logger
	manifest bool
	path     string // the temporary file while it runs

	mu   sync.Mutex
	cond *sync.Cond
	// Set once the upstream answered: the length (-1 unknown) and media type.
	ready     bool
	size      int64
	mediaType string
	written   int64
	verified  bool // the digest and length checked: the whole content may be served
	done      bool
	err       error
	status    int  // what the fill's requests answer when it failed: the upstream's refusal (404 …), 507 when the volume refused the write
	noSpace   bool // the volume has no room: each request goes to the upstream itself
	committed string
	// Whether the fill reads only from the upstream (peerSource), and how sendUpstream ends
	// the request to a peer in flight.
	toUpstream bool
	cancelPeer context.CancelCauseFunc
	handedOut  bool // a response was given bytes of the file
}

// fillIdleTimeout aborts a fill whose upstream sends nothing for this long (a stalled
// connection would otherwise hold the fill, and its waiting clients, forever).
const fillIdleTimeout = time.Minute

// wakeBytes is how much a fill reads between two wake-ups of the responses tailing it (5 ms of
// a 25 MB/s upstream).
const wakeBytes = 128 << 10

// reserveBytes is kept free on the volume (front.room): a fill needs its length beyond it.
const reserveBytes = 64 << 20

// maxManifestBytes bounds a manifest the cache parses (distribution's limit too).
const maxManifestBytes = 4 << 20

// newFill starts a fill's state; toUpstream: a peer asked for the content, so the fill never
// reads from another peer.
func newFill(d digest.Digest, repo string, manifest, toUpstream bool, log logr.Logger) *fill {
	f := &fill{d: d, repo: repo, manifest: manifest, size: -1, toUpstream: toUpstream, log: log}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func kindOf(manifest bool) string {
	if manifest {
		return typeManifest
	}
	return typeBlob
}

// pathOf is the registry API's path segment of a manifest or a blob.
func pathOf(manifest bool) string {
	if manifest {
		return "manifests"
	}
	return "blobs"
}

// origins are where a fill may read: the upstream, and first the peer that owns the digest
// (peerSource says when).
type origins struct {
	remote *remote
	peers  *peers // nil: this cache has no peers
}

// run fetches the content for repo and commits it to s; it returns when the fill ends, and
// whether the volume refused a write.
func (f *fill) run(ctx context.Context, o origins, s *store, repo string, room func() (uint64, error)) (refused bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := time.AfterFunc(fillIdleTimeout, cancel)
	defer idle.Stop()

	src, status, err := f.open(ctx, o, repo, 0)
	if err != nil {
		return f.end(failed(resultFillUpstream, status, fmt.Errorf("fetching %s: %w", f.d, err)))
	}
	defer func() { src.close() }() // the source in use when the fill ends
	size := src.size
	if room, err := room(); err == nil && room < uint64(max(size, 0)) {
		return f.end(&fillEnd{noSpace: true})
	}
	tmp, err := os.CreateTemp(s.tmpDir(), f.d.Encoded()+"-*")
	if err != nil {
		return f.end(storing(err))
	}
	f.mu.Lock()
	f.path, f.ready, f.size, f.mediaType = tmp.Name(), true, size, src.mediaType
	f.cond.Broadcast()
	f.mu.Unlock()

	n, end := f.copy(ctx, o, repo, &src, tmp, idle)
	var meta *contentMeta
	if end == nil && f.manifest {
		if meta, err = manifestMeta(tmp, f.mediaType); err != nil {
			end = failed(resultFillUpstream, 0, fmt.Errorf("manifest %s: %w", f.d, err))
		}
	}
	if end != nil {
		tmp.Close()
		return f.end(end)
	}
	// The bytes are right: responses may finish now, while the file is made durable and
	// committed (a store failure from here on only means it is not cached).
	f.mu.Lock()
	f.verified, f.size = true, n
	f.cond.Broadcast()
	f.mu.Unlock()
	if err := errors.Join(tmp.Sync(), tmp.Close()); err != nil {
		return f.end(storing(err))
	}
	f.mu.Lock()
	err = os.Rename(f.path, s.path(f.d))
	if err == nil {
		s.committed(f.d, meta)
		f.committed, f.size, f.done = s.path(f.d), n, true
		f.cond.Broadcast()
	}
	f.mu.Unlock()
	if err != nil {
		return f.end(storing(err))
	}
	storeFull.Set(0)
	fills.WithLabelValues(resultFillOK).Inc()
	return false
}

// copy reads *src into tmp until the content has the fill's digest: a peer that fails mid-body
// is replaced by the next owner or the upstream from the byte reached; bytes of another digest
// from a peer, when no response has had one of them, are fetched again from the upstream. It
// returns the size, or how the fill ends (nil: verified).
func (f *fill) copy(ctx context.Context, o origins, repo string, src **source, tmp *os.File, idle *time.Timer) (int64, *fillEnd) {
	size := (*src).size
	verifier := f.d.Verifier()
	fromPeers := map[string]bool{} // peers whose bytes the digest check covers
	buf := make([]byte, 256<<10)
	var n, woken int64
	for {
		for {
			m, rerr := (*src).Read(buf)
			if m > 0 {
				idle.Reset(fillIdleTimeout)
				if (*src).peer.Name != "" {
					fromPeers[(*src).peer.Name] = true
				}
				if _, werr := tmp.Write(buf[:m]); werr != nil {
					return n, storing(werr)
				}
				_, _ = verifier.Write(buf[:m])
				n += int64(m)
				// Waiters wake per wakeBytes, not per read: 150 responses woken for every 32 KiB
				// read would cost more CPU than the copying.
				f.mu.Lock()
				f.written = n
				if n-woken >= wakeBytes {
					woken = n
					f.cond.Broadcast()
				}
				f.mu.Unlock()
			}
			if errors.Is(rerr, io.EOF) {
				break
			}
			if rerr != nil && (*src).peer.Name != "" && ctx.Err() == nil {
				// The peer failed, stalled or was given up mid-body: the rest from the next owner
				// or the upstream, from byte n (the digest check covers both parts).
				o.peers.ended((*src).peer.Name, (*src).why(resultPeerCut), rerr)
				next, status, err := f.reopen(ctx, o, repo, n, size)
				if err != nil {
					return n, failed(resultFillUpstream, status, fmt.Errorf("fetching %s from byte %d: %w", f.d, n, err))
				}
				(*src).close()
				*src = next
				continue
			}
			if rerr != nil {
				return n, failed(resultFillUpstream, 0, fmt.Errorf("reading %s after %d bytes: %w", f.d, n, rerr))
			}
			if f.manifest && n > maxManifestBytes {
				return n, failed(resultFillUpstream, 0, fmt.Errorf("manifest %s is larger than %d bytes", f.d, maxManifestBytes))
			}
		}
		if size >= 0 && n != size {
			return n, failed(resultFillUpstream, 0, fmt.Errorf("got %d bytes of %s, announced %d", n, f.d, size))
		}
		if verifier.Verified() {
			if (*src).peer.Name != "" {
				o.peers.ended((*src).peer.Name, resultPeerOK, nil)
			}
			return n, nil
		}
		for p := range fromPeers {
			o.peers.ended(p, resultPeerMismatch, errors.New("its bytes have another digest"))
		}
		if len(fromPeers) == 0 || !f.startAgain(tmp) {
			return n, failed(resultFillMismatch, 0, fmt.Errorf("the content for %s has another digest (from the upstream, or peers %v): refused, not cached", f.d, slices.Sorted(maps.Keys(fromPeers))))
		}
		// A peer's bytes of another digest that no response has had a byte of yet: the
		// upstream's, from the start.
		next, status, err := f.reopen(ctx, o, repo, 0, size)
		if err != nil {
			return n, failed(resultFillUpstream, status, fmt.Errorf("fetching %s again: %w", f.d, err))
		}
		(*src).close()
		*src = next
		verifier, n, woken = f.d.Verifier(), 0, 0
		clear(fromPeers)
	}
}

// fillEnd is how a fill ended without committing its content: failed (what to count, the status
// its responses get, why), the volume refusing it (store), or too little free space (noSpace).
type fillEnd struct {
	result  string
	status  int
	err     error
	store   bool
	noSpace bool
}

func failed(result string, status int, err error) *fillEnd {
	return &fillEnd{result: result, status: status, err: err}
}

// storing is the volume refusing the content (full, read-only, …).
func storing(err error) *fillEnd { return &fillEnd{err: err, store: true} }

// end ends the fill as e says: every way a fill ends is written here once. It reports whether the
// volume refused the content.
func (f *fill) end(e *fillEnd) (refused bool) {
	switch {
	case e.noSpace:
		// Not cached: the responses stream from the upstream, nothing is written.
		storeFull.Set(1)
		fills.WithLabelValues(resultFillNoSpace).Inc()
		f.mu.Lock()
		f.ready, f.done, f.noSpace = true, true, true
		f.cond.Broadcast()
		f.mu.Unlock()
		return false
	case e.store:
		storeErrors.Inc()
		storeFull.Set(1)
		f.fail(resultFillStore, http.StatusInsufficientStorage, fmt.Errorf("storing %s: %w", f.d, e.err))
		return true
	default:
		f.fail(e.result, e.status, e.err)
		return false
	}
}

// open starts reading the content at byte from: from the digest's owner while peerSource names
// one (at most peerAttempts of them), else from the upstream. status is the upstream's refusal
// (404 …) when it has no content to give.
func (f *fill) open(ctx context.Context, o origins, repo string, from int64) (src *source, status int, err error) {
	for range peerAttempts {
		src := f.peerSource(ctx, o.peers)
		if src == nil {
			break
		}
		err := o.peers.open(src, repo, f.d, f.manifest, from)
		if err == nil {
			return src, 0, nil
		}
		if errors.Is(err, errNotFromPeer) || ctx.Err() != nil {
			break
		}
	}
	path := pathOf(f.manifest)
	resp, err := o.remote.send(ctx, http.MethodGet, repo, path, f.d.String(), from)
	if err != nil {
		if src := f.anyPeer(ctx, o.peers, repo, from); src != nil {
			return src, 0, nil
		}
		return nil, 0, fmt.Errorf("from the upstream: %w", err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		drain(resp)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			if src := f.anyPeer(ctx, o.peers, repo, from); src != nil {
				return src, 0, nil
			}
		}
		return nil, resp.StatusCode, fmt.Errorf("from the upstream: %s", resp.Status)
	}
	src = &source{bytes: upstreamBytes.WithLabelValues(kindOf(f.manifest))}
	if err := src.start(resp, from); err != nil {
		return nil, 0, fmt.Errorf("from the upstream: %w", err)
	}
	return src, 0, nil
}

// peerSource is the one rule for whether a fill reads from a peer: from the digest's owner,
// unless the fill reads only from the upstream (a peer asked for the content, or a peer's bytes
// had another digest), this cache has no peers, or it owns the digest itself. It returns the
// request to the owner, not yet opened, whose context sendUpstream ends; nil for the upstream.
func (f *fill) peerSource(ctx context.Context, p *peers) *source {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.toUpstream || p == nil {
		return nil
	}
	owner, ok := p.set.Owner(f.d.String())
	if !ok {
		return nil
	}
	src := &source{peer: owner}
	src.ctx, src.cancel = context.WithCancelCause(ctx)
	f.cancelPeer = src.cancel
	return src
}

// anyPeer is the fallback when the upstream does not answer (unreachable, 5xx, 429): the other
// replicas, the owner first, may hold the content (pulled while another replica owned it, before a
// scale-up moved it): the first that gives it is the source. A fill that reads only from the
// upstream (a peer asked for it) never asks: requests between replicas cannot loop.
func (f *fill) anyPeer(ctx context.Context, p *peers, repo string, from int64) *source {
	if p == nil {
		return nil
	}
	for _, peer := range p.set.Others(f.d.String()) {
		src := &source{peer: peer}
		src.ctx, src.cancel = context.WithCancelCause(ctx)
		f.mu.Lock()
		if f.toUpstream { // a peer asked for the content meanwhile
			f.mu.Unlock()
			src.cancel(errSentUpstream)
			return nil
		}
		f.cancelPeer = src.cancel
		f.mu.Unlock()
		if err := p.open(src, repo, f.d, f.manifest, from); err == nil {
			return src
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// reopen is open for a fill under way, whose content is size bytes long (-1 unknown): the new
// source must agree.
func (f *fill) reopen(ctx context.Context, o origins, repo string, from, size int64) (*source, int, error) {
	src, status, err := f.open(ctx, o, repo, from)
	if err == nil && size >= 0 && src.size >= 0 && src.size != size {
		src.close()
		return nil, 0, fmt.Errorf("%d bytes long, %d before", src.size, size)
	}
	return src, status, err
}

// peerAttempts bounds the owners one open tries before the upstream.
const peerAttempts = 3

// sendUpstream makes the fill read the rest from the upstream: a peer asked this cache for the
// content, and a peer's request must not wait on another peer (two replicas that each think the
// other owns a digest would wait on each other).
func (f *fill) sendUpstream() {
	f.mu.Lock()
	f.toUpstream = true
	cancel := f.cancelPeer
	f.mu.Unlock()
	if cancel != nil {
		cancel(errSentUpstream)
	}
}

// startAgain empties the fill's file for a new fetch when no response has been handed a byte
// of it, and sends the fill to the upstream; false when one has.
func (f *fill) startAgain(tmp *os.File) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.handedOut || tmp.Truncate(0) != nil {
		return false
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return false
	}
	f.written, f.toUpstream = 0, true
	return true
}

func (f *fill) fail(result string, status int, err error) {
	fills.WithLabelValues(result).Inc()
	f.log.Error(err, "cache fill failed", "digest", f.d.String())
	f.mu.Lock()
	f.done, f.err, f.status = true, err, status
	if !f.ready {
		f.ready = true
	} else if f.path != "" {
		_ = os.Remove(f.path)
	}
	f.cond.Broadcast()
	f.mu.Unlock()
}

// waitLocked, called with f.mu held (and returning with it held), blocks until until() holds or
// ctx ends.
func (f *fill) waitLocked(ctx context.Context, until func() bool) {
	if until() {
		return
	}
	stop := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	defer stop()
	for !until() && ctx.Err() == nil {
		f.cond.Wait()
	}
}

// tail writes bytes [from, to) of the content to w as the fill produces them (to < 0: to the
// end). It returns an error when the fill failed or the client left: the caller aborts the
// response, which must not end as if complete.
func (f *fill) tail(ctx context.Context, w http.ResponseWriter, from, to int64) error {
	f.mu.Lock()
	path := f.path
	if f.committed != "" {
		path = f.committed
	}
	file, err := os.Open(path)
	if err != nil {
		// Renamed between reading the path and opening it: the committed file is complete.
		path = f.committed
		if path != "" {
			file, err = os.Open(path)
		}
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	defer file.Close()
	rc := http.NewResponseController(w)
	pos := from
	// limit is how far the response may go now (f.mu held). The content's last byte waits for
	// the digest check: a fill that fails on it leaves every response short, hence aborted.
	limit := func() int64 {
		if f.verified {
			if to >= 0 {
				return min(to, f.size)
			}
			return f.size
		}
		if to >= 0 && to < f.written {
			return to
		}
		return f.written - 1
	}
	for {
		f.mu.Lock()
		f.waitLocked(ctx, func() bool { return limit() > pos || f.done || f.verified })
		avail, ferr, verified := limit(), f.err, f.verified
		if avail > pos {
			f.handedOut = true
		}
		f.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ferr != nil && !verified {
			return ferr
		}
		if pos < avail {
			// From the file's pages to the socket (sendfile): the bytes below written are in
			// the page cache, committed or not.
			if _, err := file.Seek(pos, io.SeekStart); err != nil {
				return err
			}
			n, err := io.CopyN(w, file, avail-pos)
			pos += n
			if err != nil {
				return err
			}
		}
		_ = rc.Flush()
		if (to >= 0 && pos >= to) || (verified && pos >= avail) {
			return nil
		}
	}
}

// manifestMeta reads a manifest's media type and the digests it references (an index's
// manifests, an image's config and layers, an artifact's blobs and subject).
func manifestMeta(f *os.File, contentType string) (*contentMeta, error) {
	var m struct {
		MediaType string                    `json:"mediaType"`
		Config    *struct{ Digest string }  `json:"config"`
		Layers    []struct{ Digest string } `json:"layers"`
		Manifests []struct{ Digest string } `json:"manifests"`
		Blobs     []struct{ Digest string } `json:"blobs"`
		Subject   *struct{ Digest string }  `json:"subject"`
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if err := json.NewDecoder(io.LimitReader(f, maxManifestBytes)).Decode(&m); err != nil {
		return nil, err
	}
	meta := &contentMeta{MediaType: contentType}
	if meta.MediaType == "" || meta.MediaType == "application/json" || meta.MediaType == "text/plain" {
		meta.MediaType = m.MediaType
	}
	add := func(s string) {
		if d, err := digest.Parse(s); err == nil {
			meta.Refs = append(meta.Refs, d)
		}
	}
	if m.Config != nil {
		add(m.Config.Digest)
	}
	if m.Subject != nil {
		add(m.Subject.Digest)
	}
	for _, l := range [][]struct{ Digest string }{m.Layers, m.Manifests, m.Blobs} {
		for _, x := range l {
			add(x.Digest)
		}
	}
	return meta, nil
}
