package mirrorcache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache/peerset"
)

// The replicas of a mirror act as one cache (docs/mirrors.md, Replicas): a pod that lacks
// content asks the pod that owns the digest (peerset's rendezvous hashing) before the upstream,
// on the owner's peer port, and streams while the owner fills; the owner is the only one that
// fetches from the upstream. A request on the peer port is never sent to another peer, so
// requests cannot loop. A peer that fails to connect, answers 5xx, stalls, is cut, or sends bytes
// of another digest is skipped for a while, and the fill goes on from the next owner or the
// upstream, from the byte it had reached.

// PeerOptions make a cache one of several replicas acting as one cache.
type PeerOptions struct {
	// Addr is the peer port's listen address (mirror.PeerPort); Listener, when set, replaces
	// it (a test binds port 0). It serves content by digest to the other replicas.
	Addr     string
	Listener net.Listener
	// Set is the replicas as this one sees them (peerset.New).
	Set *peerset.Set
	// Lookup, when set, finds the replicas now (peerset.LookupSRV): the cache asks it every
	// LookupInterval, each time for at most LookupTimeout. Without it Set stays as given.
	Lookup func(context.Context) ([]peerset.Peer, error)
	// Timeouts and the lookup's interval; zero means the defaults below (tests shorten them).
	ConnectTimeout, StallTimeout, LookupInterval, LookupTimeout time.Duration
}

// peerLookupInterval is how often the replicas are looked up: a pod that became ready or went
// away is seen within it (until then, a gone one is skipped after its first failure). A lookup
// that takes longer than peerLookupTimeout (the DNS does not answer) keeps the replicas known;
// at start, the cache serves once the first lookup ended.
const (
	peerLookupInterval = 5 * time.Second
	peerLookupTimeout  = 5 * time.Second
)

// Peer timeouts: in-cluster connections are quick, and an owner that sends nothing for
// peerStallTimeout (headers or body) costs the pulls waiting on it no more than that before
// the upstream serves them.
const (
	peerConnectTimeout = time.Second
	peerStallTimeout   = 10 * time.Second
)

// peers is a cache's client of the other replicas: its own connections (never counted as the
// upstream's) and the set it picks owners from.
type peers struct {
	set                           *peerset.Set
	client                        *http.Client
	stall                         time.Duration
	lookupInterval, lookupTimeout time.Duration
	log                           logr.Logger
}

func newPeers(o PeerOptions, log logr.Logger) *peers {
	connect, stall, every, lookup := o.ConnectTimeout, o.StallTimeout, o.LookupInterval, o.LookupTimeout
	if connect <= 0 {
		connect = peerConnectTimeout
	}
	if stall <= 0 {
		stall = peerStallTimeout
	}
	if every <= 0 {
		every = peerLookupInterval
	}
	if lookup <= 0 {
		lookup = peerLookupTimeout
	}
	return &peers{
		set: o.Set,
		client: &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		}},
		stall:          stall,
		lookupInterval: every,
		lookupTimeout:  lookup,
		log:            log,
	}
}

// logPeers says who the replicas are now, by name: a scale up or down, a pod becoming ready or
// going away shows in each pod's log.
func (p *peers) logPeers(members []peerset.Peer) {
	names := make([]string, 0, len(members))
	for _, p := range members {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	p.log.Info("cache peers changed", "peers", strings.Join(names, ","))
}

// source is an open body a fill reads: from the upstream or from a peer, starting at offset.
type source struct {
	body      io.ReadCloser
	size      int64 // the whole content's length; -1 unknown
	mediaType string
	bytes     prometheus.Counter // the content's bytes read: upstream_bytes_total or peer_bytes_total

	// A peer's request (peer.Name "" for the upstream): one context, ended by a stall
	// (errPeerStalled), by sendUpstream (errSentUpstream) or by the fill's own end.
	peer       peerset.Peer
	ctx        context.Context
	cancel     context.CancelCauseFunc
	stall      *time.Timer // cancels ctx when the peer sends nothing for stallAfter
	stallAfter time.Duration
}

// Why a peer's request was ended by this cache.
var (
	errPeerStalled  = errors.New("the peer sent nothing for the stall timeout")
	errSentUpstream = errors.New("the fill went to the upstream")
)

// Read reads the body, counting its bytes: the one place content bytes are counted, the
// upstream's and the peers' alike. A peer's bytes start its stall timer again.
func (s *source) Read(b []byte) (int, error) {
	n, err := s.body.Read(b)
	if n > 0 {
		s.bytes.Add(float64(n))
		if s.stall != nil {
			s.stall.Reset(s.stallAfter)
		}
	}
	return n, err
}

// start takes resp's body as the source's, from byte from on (bodyStart).
func (s *source) start(resp *http.Response, from int64) error {
	size, err := bodyStart(resp, from)
	if err != nil {
		resp.Body.Close()
		return err
	}
	s.body, s.size, s.mediaType = resp.Body, size, resp.Header.Get("Content-Type")
	return nil
}

func (s *source) close() {
	if s.stall != nil {
		s.stall.Stop()
	}
	if s.cancel != nil {
		s.cancel(nil)
	}
	s.body.Close()
}

// why says how a peer's request ended early: stalled, canceled (the fill went to the upstream,
// or ended), or otherwise when this cache did not end it (the peer failed on its own).
func (s *source) why(otherwise string) string {
	switch {
	case errors.Is(context.Cause(s.ctx), errPeerStalled):
		return resultPeerStalled
	case s.ctx.Err() != nil:
		return resultPeerCanceled
	default:
		return otherwise
	}
}

// errNotFromPeer means the peer gave an answer that is not content (404, 401 …): the upstream
// is asked, and the peer is not marked as failing.
var errNotFromPeer = errors.New("the peer has no content to give")

// open asks src's peer (fill.peerSource) for bytes [from, …) of d for repo. It gives up when the
// peer sends nothing for the stall timeout; it counts a failed request (ended), and src's request
// is counted when its body ends (fill.copy).
func (p *peers) open(src *source, repo string, d digest.Digest, manifest bool, from int64) error {
	target := (&url.URL{Scheme: "http", Host: src.peer.Addr, Path: "/v2/" + repo + "/" + pathOf(manifest) + "/" + d.String()}).String()
	src.stallAfter = p.stall
	src.stall = time.AfterFunc(p.stall, func() { src.cancel(errPeerStalled) })
	fail := func(result string, err error) error {
		src.stall.Stop()
		src.cancel(nil)
		p.ended(src.peer.Name, result, fmt.Errorf("%s: %w", d, err))
		return err
	}
	req, err := http.NewRequestWithContext(src.ctx, http.MethodGet, target, nil)
	if err != nil {
		return fail(resultPeerError, err)
	}
	if from > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(from, 10)+"-")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fail(src.why(resultPeerUnreachable), err)
	}
	name := src.peer.Name
	switch {
	case resp.StatusCode == http.StatusBadGateway:
		// The owner is well but its upstream refused or did not answer (upstreamFailed): not the
		// peer's fault, and no other owner would do better; this cache asks the upstream itself.
		drain(resp)
		return fail(resultPeerRefused, fmt.Errorf("peer %s answered %s: %w", name, resp.Status, errNotFromPeer))
	case resp.StatusCode >= 500:
		drain(resp)
		return fail(resultPeerError, fmt.Errorf("peer %s answered %s", name, resp.Status))
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent:
		drain(resp)
		return fail(resultPeerRefused, fmt.Errorf("peer %s answered %s: %w", name, resp.Status, errNotFromPeer))
	}
	if err := src.start(resp, from); err != nil {
		return fail(resultPeerError, fmt.Errorf("peer %s: %w", name, err))
	}
	src.bytes = peerBytes.WithLabelValues(kindOf(manifest))
	src.stall.Reset(p.stall)
	return nil
}

// ended counts how a request to peer ended, and skips the peer for a while when it failed: the
// one place requests to peers are counted.
func (p *peers) ended(peer, result string, err error) {
	peerRequests.WithLabelValues(result).Inc()
	switch result {
	case resultPeerOK, resultPeerRefused, resultPeerCanceled:
		return
	}
	p.set.Failed(peer)
	p.log.Error(err, "peer failed: the next owner or the upstream serves instead", "peer", peer, "peer.result", result)
}

// bodyStart checks that resp's body starts at byte from of the content (a 206 for that range,
// or a 200 whose first bytes are skipped) and returns the content's whole length (-1 unknown).
func bodyStart(resp *http.Response, from int64) (int64, error) {
	if resp.StatusCode == http.StatusOK {
		if from > 0 {
			if _, err := io.CopyN(io.Discard, resp.Body, from); err != nil {
				return 0, fmt.Errorf("skipping to byte %d: %w", from, err)
			}
		}
		return resp.ContentLength, nil
	}
	// Content-Range: bytes from-last/size
	spec, ok := strings.CutPrefix(resp.Header.Get("Content-Range"), "bytes ")
	rng, total, ok2 := strings.Cut(spec, "/")
	first, _, ok3 := strings.Cut(rng, "-")
	start, err := strconv.ParseInt(first, 10, 64)
	if !ok || !ok2 || !ok3 || err != nil || start != from {
		return 0, fmt.Errorf("a partial answer %q, not from byte %d", resp.Header.Get("Content-Range"), from)
	}
	size, err := strconv.ParseInt(total, 10, 64)
	if err != nil {
		return -1, nil //nolint:nilerr // "*": the length is unknown
	}
	return size, nil
}

// tag asks the other replicas, the tag's owner first, where repo:tag last pointed when one of them
// resolved it: the answer a pod that never saw the tag serves while the upstream does not answer.
// Each replica answers from its own store only (servePeers).
func (p *peers) tag(ctx context.Context, repo, tag string) (digest.Digest, bool) {
	for _, peer := range p.set.Others(repo + ":" + tag) {
		target := (&url.URL{Scheme: "http", Host: peer.Addr, Path: "/v2/" + repo + "/manifests/" + tag}).String()
		rctx, cancel := context.WithTimeout(ctx, p.stall)
		req, err := http.NewRequestWithContext(rctx, http.MethodHead, target, nil)
		if err != nil {
			cancel()
			return "", false
		}
		resp, err := p.client.Do(req)
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return "", false
			}
			p.ended(peer.Name, resultPeerUnreachable, fmt.Errorf("tag %s:%s: %w", repo, tag, err))
			continue
		}
		drain(resp)
		cancel()
		if resp.StatusCode != http.StatusOK {
			p.ended(peer.Name, resultPeerRefused, nil)
			continue
		}
		d, err := digest.Parse(resp.Header.Get("Docker-Content-Digest"))
		if err != nil {
			p.ended(peer.Name, resultPeerError, fmt.Errorf("tag %s:%s: %w", repo, tag, err))
			continue
		}
		p.ended(peer.Name, resultPeerOK, nil)
		return d, true
	}
	return "", false
}

// servePeers answers the other replicas on the peer port: GET and HEAD of content by digest,
// from the store or a fill of this cache, never sent on to another peer, and HEAD of a manifest
// by tag from the store alone (where the tag last pointed here; peers.tag). It serves nothing the
// registry port does not serve to any client (docs/mirrors.md, Replicas).
func (f *front) servePeers() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo, kind, ref, ok := contentPath(r)
		if ok && kind == "/manifests/" && r.Method == http.MethodHead && tagName.MatchString(ref) {
			d, known := f.store.tag(repo, ref)
			if !known {
				registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "this replica never resolved the tag")
				return
			}
			w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			w.Header().Set("Docker-Content-Digest", d.String())
			w.WriteHeader(http.StatusOK)
			return
		}
		d, err := digest.Parse(ref)
		if !ok || err != nil {
			registryError(w, http.StatusNotFound, "NOT_FOUND", "the peer port serves content by digest, and tags it resolved (HEAD)")
			return
		}
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		manifest := kind == "/manifests/"
		peerServed.WithLabelValues(kindOf(manifest)).Inc()
		f.serve(w, r, repo, d, manifest, false, true)
	})
}
