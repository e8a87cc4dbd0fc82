package mirrorcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The cache's metrics, in the process's default Prometheus registry (registerMetrics), beside the
// Go runtime's and the process's.
var (
	servedRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_http_requests_total",
		Help: "Requests the cache answered, by method and status code.",
	}, []string{"method", "code"})

	upstreamRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_upstream_requests_total",
		Help: "Requests the cache sent upstream (the registry, its token service, blob redirects) by result: " +
			"ok, challenge (the 401 that starts authentication), unauthorized (any other 401), denied (403), " +
			"not_found (404), error (other HTTP errors), unreachable (no HTTP answer), timeout (no answer in the time it was given), " +
			"canceled (the client left).",
	}, []string{"result"})
	upstreamStates = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_upstream_state",
		Help: "1 for what the upstream did last (each change logged once): ok, rate_limited (429), failing (5xx, other errors), " +
			"refusing (401 or 403 to the cache's credentials, or wanting some), unreachable (no connection), stalled (no answer in time).",
	}, []string{"state"})
	tagFallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_tag_fallbacks_total",
		Help: "Pulls by tag answered from the cache's last answer because the upstream did not say where the tag points, " +
			"by what it did instead: rate_limited, failing, refusing, unreachable, stalled (no answer within 5 s).",
	}, []string{"reason"})
)

// The upstream's states (upstreamStates, tagFallbacks' reasons but ok).
const (
	upstreamOK          = "ok"
	upstreamRateLimited = "rate_limited"
	upstreamFailing     = "failing"
	upstreamRefusing    = "refusing"
	upstreamUnreachable = "unreachable"
	upstreamStalled     = "stalled"
)

var upstreamStateNames = []string{upstreamOK, upstreamRateLimited, upstreamFailing, upstreamRefusing, upstreamUnreachable, upstreamStalled}

// upstreamHealth is what the upstream did last, as one of the states above: the gauge follows it,
// and each change (not each request: a kubelet retrying through an outage makes thousands) is
// logged once.
type upstreamHealth struct {
	log   logr.Logger
	mu    sync.Mutex
	state string
}

// set records state; detail is logged with a change to it (and err, for a failure).
func (h *upstreamHealth) set(state, detail string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if state == h.state {
		return
	}
	was := h.state
	h.state = state
	for _, s := range upstreamStateNames {
		v := 0.0
		if s == state {
			v = 1
		}
		upstreamStates.WithLabelValues(s).Set(v)
	}
	if state == upstreamOK {
		if was != "" {
			h.log.Info("the upstream answers again", "upstream.was", was)
		}
		return
	}
	h.log.Error(err, "upstream "+state+": "+detail, "upstream.was", was)
}

// current is the state last set ("" before the first answer).
func (h *upstreamHealth) current() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// The data path's metrics (front.go, fill.go).
var (
	upstreamBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_upstream_bytes_total",
		Help: "Content bytes the cache read from the upstream, by type (blob, manifest): ideally each cached byte once.",
	}, []string{"type"})
	cacheRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_cache_requests_total",
		Help: "Content requests by type and result: hit (served from the volume), miss (started a fill), " +
			"coalesced (joined a fill in flight), pass_through (the volume had no room: streamed from the upstream, not stored).",
	}, []string{"type", "result"})
	coalesced = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_coalesced_requests_total",
		Help: "Requests that shared an upstream fetch already in flight (a fill, or a tag lookup) instead of making their own, by type.",
	}, []string{"type"})
	fillsInFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_fills_in_flight",
		Help: "Upstream fetches into the cache running now.",
	})
	fills = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_fills_total",
		Help: "Ended fills by result: ok (committed), upstream_error (refused, failed or cut mid-body), " +
			"digest_mismatch (the upstream's or a peer's bytes have another digest: refused), store_error (the volume refused the write), " +
			"no_space (not stored: the volume is full).",
	}, []string{"result"})
	storeFull = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_store_full",
		Help: "1 while the cache volume refuses content (full or failing): pulls are streamed from the upstream, not cached.",
	})
	storeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quartermaster_mirror_store_errors_total",
		Help: "Writes to the cache volume that failed.",
	})
	evicted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quartermaster_mirror_evicted_total",
		Help: "Blobs and manifests deleted, least recently pulled first, while the volume was above its high-water mark (spec.eviction: 85% used by default, down to 75%); pinned content never.",
	})
	evictedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quartermaster_mirror_evicted_bytes_total",
		Help: "Bytes of the content evicted (quartermaster_mirror_evicted_total).",
	})
	pinnedImages = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_pinned_images",
		Help: "Images the mirror's pins file names (in use by the cluster's workloads, or within ttl of their last use): their content is never expired or evicted.",
	})
	pinnedBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_pinned_bytes",
		Help: "Bytes of the content the pins hold that this cache pod stores (counted every 30 s, at every eviction and after a warm).",
	})
	pinnedOverHighWater = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_pinned_over_high_water",
		Help: "1 when pinned content alone is above the volume's high-water mark: eviction cannot bring the volume under it (a larger volume is needed).",
	})
	pinsWarmed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_pins_warmed_total",
		Help: "Pinned images this cache pod fetched before any node asked (it owns the pin among the mirror's pods and did not hold it), by result: ok, failed (logged; tried again after 5 minutes).",
	}, []string{"result"})
	expired = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quartermaster_mirror_expired_total",
		Help: "Blobs and manifests deleted from the volume: not pulled within the ttl and referenced by no kept manifest.",
	})
)

// The replicas' metrics (peer.go): traffic between the cache pods of one mirror, never counted
// as the upstream's.
var (
	peerRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_peer_requests_total",
		Help: "Content requests this cache sent to the replica owning the digest, by how they ended: ok (the whole content), " +
			"refused (an answer without content, e.g. 404: the upstream is asked), error (5xx or a bad answer), unreachable (no connection), " +
			"stalled (nothing for the stall timeout), cut (the body broke off), digest_mismatch (bytes of another digest: refused), " +
			"canceled (the fill went to the upstream instead). All but ok, refused and canceled skip the replica for a while.",
	}, []string{"result"})
	peerBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_peer_bytes_total",
		Help: "Content bytes this cache read from other replicas, by type (blob, manifest).",
	}, []string{"type"})
	peerServed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quartermaster_mirror_peer_served_requests_total",
		Help: "Content requests other replicas sent this cache on its peer port, by type (blob, manifest).",
	}, []string{"type"})
	peersKnown = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "quartermaster_mirror_peers",
		Help: "Other replicas of the mirror this cache knows, by state: up, or down (failed lately: skipped, their digests go to the next owner).",
	}, []string{"state"})
)

// Label values of the data path's metrics.
const (
	typeBlob     = "blob"
	typeManifest = "manifest"

	resultHit         = "hit"
	resultMiss        = "miss"
	resultCoalesced   = "coalesced"
	resultPassThrough = "pass_through"

	resultFillOK       = "ok"
	resultFillUpstream = "upstream_error"
	resultFillMismatch = "digest_mismatch"
	resultFillStore    = "store_error"
	resultFillNoSpace  = "no_space"

	resultPeerOK          = "ok"
	resultPeerRefused     = "refused"
	resultPeerError       = "error"
	resultPeerUnreachable = "unreachable"
	resultPeerStalled     = "stalled"
	resultPeerCut         = "cut"
	resultPeerMismatch    = "digest_mismatch"
	resultPeerCanceled    = "canceled"
)

// Upstream results, the values of upstreamRequests' label.
const (
	resultOK           = "ok"
	resultChallenge    = "challenge"
	resultUnauthorized = "unauthorized"
	resultDenied       = "denied"
	resultNotFound     = "not_found"
	resultError        = "error"
	resultUnreachable  = "unreachable"
	resultTimeout      = "timeout"
	resultCanceled     = "canceled"
)

var metricsRegistered sync.Once

// registerMetrics registers the cache's metrics in the process's default Prometheus registry,
// once: the caches of one process (tests run several) share them.
func registerMetrics() {
	metricsRegistered.Do(func() {
		prometheus.MustRegister(servedRequests, upstreamRequests, upstreamStates, tagFallbacks, upstreamBytes, cacheRequests, coalesced, fillsInFlight, fills,
			storeFull, storeErrors, evicted, evictedBytes, pinnedImages, pinnedBytes, pinnedOverHighWater, pinsWarmed, expired, peerRequests, peerBytes, peerServed, peersKnown)
		pinsWarmed.WithLabelValues("ok")
		pinsWarmed.WithLabelValues("failed")
		for _, s := range upstreamStateNames {
			upstreamStates.WithLabelValues(s)
			if s != upstreamOK {
				tagFallbacks.WithLabelValues(s)
			}
		}
		for _, r := range []string{resultPeerOK, resultPeerRefused, resultPeerError, resultPeerUnreachable, resultPeerStalled, resultPeerCut, resultPeerMismatch, resultPeerCanceled} {
			peerRequests.WithLabelValues(r)
		}
		for _, t := range []string{typeBlob, typeManifest} {
			peerBytes.WithLabelValues(t)
			peerServed.WithLabelValues(t)
			upstreamBytes.WithLabelValues(t)
			coalesced.WithLabelValues(t)
			for _, r := range []string{resultHit, resultMiss, resultCoalesced, resultPassThrough} {
				cacheRequests.WithLabelValues(t, r)
			}
		}
		for _, r := range []string{resultFillOK, resultFillUpstream, resultFillMismatch, resultFillStore, resultFillNoSpace} {
			fills.WithLabelValues(r)
		}
		for _, r := range []string{resultOK, resultChallenge, resultUnauthorized, resultDenied, resultNotFound, resultError, resultUnreachable, resultTimeout, resultCanceled} {
			upstreamRequests.WithLabelValues(r)
		}
	})
}

// upstreamTransport is the transport of the cache's one upstream client (remote.go): every
// request to the upstream, its token service and its blob redirects goes through it, counted
// and its result kept in health (upstreamObserver), and gives up connecting sooner than Go's
// default. A swallowed upstream error is otherwise invisible: a tag lookup the upstream refuses
// falls back to the cache's copy.
func upstreamTransport(health *upstreamHealth) http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = (&net.Dialer{Timeout: upstreamDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	return upstreamObserver{next: t, health: health}
}

// upstreamDialTimeout bounds a connection attempt to the upstream (Go's default is 30 s).
const upstreamDialTimeout = 5 * time.Second

// upstreamObserver counts the upstream's answers and keeps the upstream's state. What it logs
// names the host and path, never a header or the query (a token request's query names the
// account).
type upstreamObserver struct {
	next   http.RoundTripper
	health *upstreamHealth
}

func (o upstreamObserver) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.next.RoundTrip(req)
	result := classify(req, resp, err)
	upstreamRequests.WithLabelValues(result).Inc()
	where := req.Method + " " + req.URL.Host + req.URL.Path
	switch state := stateOf(result, statusOf(resp)); state {
	case "":
	case upstreamRefusing:
		if req.Header.Get("Authorization") != "" {
			o.health.set(state, fmt.Sprintf("it refused the cache's credentials (check the username and password of the mirror's credentials Secret): %s: %s", where, resp.Status), nil)
		} else {
			o.health.set(state, fmt.Sprintf("it wants credentials and the cache has none: %s: %s", where, resp.Status), nil)
		}
	case upstreamRateLimited, upstreamFailing:
		o.health.set(state, where+": "+resp.Status, nil)
	case upstreamStalled:
		o.health.set(state, where+": no answer in time", err)
	default:
		o.health.set(state, where, err)
	}
	return resp, err
}

func statusOf(resp *http.Response) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

// stateOf is the upstream's state after a request that ended as result (classify) with status:
// the one rule for the state gauge and for why a tag pull fell back ("" for a request the
// client gave up: it says nothing of the upstream).
func stateOf(result string, status int) string {
	switch result {
	case resultOK, resultChallenge, resultNotFound:
		return upstreamOK
	case resultUnauthorized, resultDenied:
		return upstreamRefusing
	case resultError:
		if status == http.StatusTooManyRequests {
			return upstreamRateLimited
		}
		return upstreamFailing
	case resultUnreachable:
		return upstreamUnreachable
	case resultTimeout:
		return upstreamStalled
	}
	return ""
}

func classify(req *http.Request, resp *http.Response, err error) string {
	switch {
	case err != nil && errors.Is(req.Context().Err(), context.DeadlineExceeded):
		return resultTimeout // the request's own time ran out: the upstream took the connection and said nothing
	case err != nil && (errors.Is(err, context.Canceled) || req.Context().Err() != nil):
		return resultCanceled
	case err != nil:
		return resultUnreachable
	case resp.StatusCode == http.StatusUnauthorized && req.Header.Get("Authorization") == "" && resp.Header.Get("WWW-Authenticate") != "":
		return resultChallenge
	}
	return statusResult(resp.StatusCode)
}

// statusResult is the result of an HTTP answer with code (classify, beside the challenge).
func statusResult(code int) string {
	switch {
	case code < 400:
		return resultOK
	case code == http.StatusUnauthorized:
		return resultUnauthorized
	case code == http.StatusForbidden:
		return resultDenied
	case code == http.StatusNotFound:
		return resultNotFound
	}
	return resultError
}

// countServed counts the cache's answers on its registry port.
func countServed(h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerCounter(servedRequests, h)
}

// metricsHandler serves the default registry: the cache's metrics and the process's (Go runtime).
func metricsHandler() http.Handler {
	return promhttp.HandlerFor(prometheus.DefaultGatherer, promhttp.HandlerOpts{})
}
