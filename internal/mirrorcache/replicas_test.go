package mirrorcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/quartermaster-dev/quartermaster/internal/mirrorcache/peerset"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// replica is one of a mirror's cache pods, run as its own process.
type replica struct {
	*childCache
	name, peerAddr string
	files          cacheFiles
}

// newReplicas names n cache pods of up (mirror-test-<ordinal>) and gives each a peer port and a
// volume; none runs yet.
func newReplicas(t *testing.T, up *upstream, n int) []*replica {
	t.Helper()
	var rs []*replica
	for i := range n {
		rs = append(rs, &replica{name: fmt.Sprintf("mirror-test-%d", i), peerAddr: freeAddr(t), files: newCacheFiles(t, up.URL, "", "")})
	}
	return rs
}

// start runs r as its own process; env says how it finds the other replicas.
func (r *replica) start(t *testing.T, env ...string) {
	t.Helper()
	r.childCache = startChild(t, r.files, append(env, envChildPeerName+"="+r.name, envChildPeerAddr+"="+r.peerAddr)...)
}

// startReplicas runs n caches of up as processes that know each other as one mirror's replicas:
// a fixed list, as the headless Service's SRV records give it in a cluster.
func startReplicas(t *testing.T, up *upstream, n int) []*replica {
	t.Helper()
	rs := newReplicas(t, up, n)
	var list []string
	for _, r := range rs {
		list = append(list, r.name+"="+r.peerAddr)
	}
	for _, r := range rs {
		r.start(t, envChildPeers+"="+strings.Join(list, ","))
	}
	return rs
}

// ownerOf is the replica that owns d while every replica is up.
func ownerOf(rs []*replica, d digest.Digest) *replica {
	var members []peerset.Peer
	for _, r := range rs {
		members = append(members, peerset.Peer{Name: r.name, Addr: r.peerAddr})
	}
	p, _ := peerset.New("observer", members).Owner(d.String())
	for _, r := range rs {
		if r.name == p.Name {
			return r
		}
	}
	return nil
}

// sum adds a series over replicas.
func sum(t *testing.T, rs []*replica, series string) float64 {
	t.Helper()
	total := 0.0
	for _, r := range rs {
		total += r.metrics(t)[series]
	}
	return total
}

// waitFillsDone waits until no replica has a fill running (a response ends at the digest check,
// before its fill's commit).
func waitFillsDone(t *testing.T, rs []*replica) {
	t.Helper()
	testenv.PollFor(t, "no replica to have a fill running", 5*time.Millisecond, 30*time.Second, func() (bool, string) {
		n := sum(t, rs, fillsInFlightSeries)
		return n == 0, fmt.Sprintf("%v fills running", n)
	})
}

const (
	peerBlobBytes   = `quartermaster_mirror_peer_bytes_total{type="blob"}`
	peerServedBlobs = `quartermaster_mirror_peer_served_requests_total{type="blob"}`
	manifestBytes   = `quartermaster_mirror_upstream_bytes_total{type="manifest"}`
)

func peerResult(r string) string {
	return `quartermaster_mirror_peer_requests_total{result="` + r + `"}`
}

// Three replicas pulled at once through each of them act as one cache: the upstream serves every
// blob and the manifest once; each of the other two replicas reads it from its owner, once.
func TestReplicasFetchFromTheUpstreamOnce(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	var layers [][]byte
	blobBytes := 0
	for range 6 {
		layers = append(layers, randomBytes(512<<10))
	}
	img := up.pushImage(t, "team/app", []byte(`{"architecture":"amd64","os":"linux"}`), layers...)
	for _, b := range img.blobs {
		blobBytes += int(b.Size)
	}
	rs := startReplicas(t, up, 3)

	var wg sync.WaitGroup
	for _, r := range rs {
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, "http://"+r.addr)
		for range 4 {
			wg.Go(func() { mustPull(t, hosts, img.byTag(up)) })
		}
	}
	wg.Wait()
	waitFillsDone(t, rs)

	seen := up.requests()
	for _, d := range append(img.blobs, img.manifest) {
		kind := "blobs"
		if d.Digest == img.manifest.Digest {
			kind = "manifests"
		}
		if n := count(seen, "GET /v2/team/app/"+kind+"/"+d.Digest.String()); n != 1 {
			t.Errorf("the upstream served %s %d times, want once: %q", d.Digest, n, seen)
		}
	}
	if got := sum(t, rs, upstreamBlobBytes); got != float64(blobBytes) {
		t.Errorf("the replicas read %v blob bytes from the upstream, want the image's %d", got, blobBytes)
	}
	if got := sum(t, rs, manifestBytes); got != float64(img.manifest.Size) {
		t.Errorf("the replicas read %v manifest bytes from the upstream, want %d", got, img.manifest.Size)
	}
	if got := sum(t, rs, peerBlobBytes); got != float64(2*blobBytes) {
		t.Errorf("the replicas read %v blob bytes from each other, want twice the image's %d (each blob by the two non-owners)", got, blobBytes)
	}
	want := float64(2 * (len(img.blobs) + 1))
	if ok, served := sum(t, rs, peerResult(resultPeerOK)), sum(t, rs, peerServedBlobs); ok != want || served != want-2 {
		t.Errorf("peer requests ok %v, blob requests served to peers %v: want %v and %v", ok, served, want, want-2)
	}
	// Every replica stored everything it served.
	for _, r := range rs {
		for _, d := range img.blobs {
			if !stored(r.files, d.Digest) {
				t.Errorf("%s did not store %s", r.name, d.Digest)
			}
		}
	}
}

// An image pulled by tag through one replica is served by tag through another with the upstream
// down: the Service sends a node's pulls to any pod, and a pod that never resolved the tag asks the
// others where it last pointed (a kubelet on a real node failed here: test/realnode).
func TestReplicasServeATagAnotherResolvedDuringAnOutage(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	img := up.push(t, "team/app")
	rs := startReplicas(t, up, 2)
	first, second := t.TempDir(), t.TempDir()
	writeHostsDir(t, first, up, "http://"+rs[0].addr)
	writeHostsDir(t, second, up, "http://"+rs[1].addr)
	mustPull(t, first, img.byTag(up))
	waitFillsDone(t, rs)

	up.stop()
	mustPull(t, second, img.byTag(up))
	if got := rs[1].metrics(t)[peerResult(resultPeerOK)]; got < 1 {
		t.Errorf("the second replica asked no peer successfully (%v)", got)
	}
	// A tag no replica resolved is still refused while the upstream is down.
	mustFail(t, second, up.Host+"/team/app:never")
}

// A replica that joined after an image was pulled owns some of its blobs but holds none; with the
// upstream down it reads them from the replica that holds them (the owner first, then the others)
// instead of failing the pull.
func TestNewReplicaServesWhatAnotherHoldsDuringAnOutage(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	var layers [][]byte
	for range 6 {
		layers = append(layers, randomBytes(64<<10))
	}
	img := up.pushImage(t, "team/app", []byte(`{"architecture":"amd64","os":"linux"}`), layers...)
	rs := newReplicas(t, up, 2)
	old, joined := rs[0], rs[1]
	old.start(t, envChildPeers+"="+old.name+"="+old.peerAddr) // alone: it fetches everything
	hosts := t.TempDir()
	writeHostsDir(t, hosts, up, "http://"+old.addr)
	mustPull(t, hosts, img.byTag(up))
	waitFillsDone(t, rs[:1])

	up.stop()
	joined.start(t, envChildPeers+"="+old.name+"="+old.peerAddr+","+joined.name+"="+joined.peerAddr)
	owned := 0
	for _, b := range img.blobs {
		if ownerOf(rs, b.Digest) == joined {
			owned++
		}
	}
	if owned == 0 {
		t.Fatal("the joined replica owns none of the image's blobs: the test shows nothing")
	}
	hosts = t.TempDir()
	writeHostsDir(t, hosts, up, "http://"+joined.addr)
	mustPull(t, hosts, img.byDigest(up))
	if got := joined.metrics(t)[peerResult(resultPeerOK)]; got < float64(len(img.blobs)+1) {
		t.Errorf("the joined replica read %v contents from its peer, want every blob and the manifest (%d)", got, len(img.blobs)+1)
	}
}

// The owner of a blob is killed (SIGKILL) while it fills it from the upstream and the other two
// replicas stream it from the owner: their clients get the whole blob, right (the fills go on
// from the byte they reached, from the next owner or the upstream); the killed replica's clients
// see a cut connection, never a complete-looking body; the upstream serves the blob once more,
// and the survivors serve pulls with the owner gone.
func TestReplicaKilledMidFill(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(4 << 20)
	img := up.pushImage(t, "team/app", []byte(`{"architecture":"amd64","os":"linux"}`), layer)
	rs := startReplicas(t, up, 3)
	g := newGate(layer, serveWhole)
	up.setFault(g.fault)
	owner := ownerOf(rs, g.d)

	type reader struct {
		r    *replica
		resp *http.Response
		head []byte
	}
	var readers []*reader
	for _, r := range rs {
		for range 2 {
			resp := getFrom(context.Background(), t, "http://"+r.addr+"/v2/team/app/blobs/"+g.d.String(), "", http.StatusOK)
			if resp == nil {
				t.FailNow()
			}
			defer resp.Body.Close()
			rd := &reader{r: r, resp: resp, head: make([]byte, 512<<10)}
			if _, err := io.ReadFull(resp.Body, rd.head); err != nil {
				t.Fatalf("%s: the first bytes did not arrive while the upstream held the rest: %v", r.name, err)
			}
			readers = append(readers, rd)
		}
	}
	if served := owner.metrics(t)[peerServedBlobs]; served != 2 {
		t.Fatalf("the owner served the blob to %v peers, want 2", served)
	}
	if err := owner.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-owner.exited
	close(g.release)

	var survivors []*replica
	for _, r := range rs {
		if r != owner {
			survivors = append(survivors, r)
		}
	}
	for _, rd := range readers {
		rest, err := io.ReadAll(rd.resp.Body)
		rd.resp.Body.Close()
		switch {
		case rd.r == owner && err == nil:
			t.Errorf("a client of the killed replica got a complete-looking body of %d bytes", len(rd.head)+len(rest))
		case rd.r != owner && (err != nil || !bytes.Equal(append(rd.head, rest...), layer)):
			t.Errorf("a client of %s got %d bytes (%v), not the blob", rd.r.name, len(rd.head)+len(rest), err)
		}
	}
	waitFillsDone(t, survivors)
	if n := count(up.requests(), "GET /v2/team/app/blobs/"+g.d.String()); n != 2 {
		t.Errorf("the upstream served the blob %d times, want 2 (the killed owner's fill, then one survivor's from where it was)", n)
	}
	if got := sum(t, survivors, upstreamBlobBytes); got > float64(len(layer)) {
		t.Errorf("the survivors read %v bytes of the blob from the upstream, more than the blob", got)
	}
	for _, r := range survivors {
		if !stored(r.files, g.d) {
			t.Errorf("%s did not store the blob", r.name)
		}
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, "http://"+r.addr)
		mustPull(t, hosts, img.byTag(up))
	}
	for _, s := range up.requests() {
		if !strings.HasPrefix(s, "HEAD /v2/team/app/manifests/") && !strings.HasPrefix(s, "GET /v2/team/app/manifests/") && !strings.HasPrefix(s, "GET /v2/team/app/blobs/"+img.blobs[0].Digest.String()) {
			t.Errorf("after the kill the upstream saw %q: the blob again", s)
		}
	}
}

// Peer fault modes (a stand-in replica that misbehaves) besides the upstream's.
const (
	peerUnreachable = "unreachable" // nothing listens
	peerHang        = "hang"        // accepts, never answers
	peerStall       = "stall"       // the first MiB, then nothing
	// Bytes of another digest that no response had a byte of (the client asks for the last
	// byte only, which waits for the digest check).
	peerMismatchUnsent = "mismatch-unsent"
)

// A replica that owns a blob but fails (refuses connections, answers 5xx, hangs, stalls or is
// cut mid-body, or sends bytes of another digest) is refused: the client gets the blob from the
// upstream, whole, with no failed pull. Bytes of another digest are never completed to a client
// nor stored: a client that had some of them sees its response cut and the next pull gets the
// upstream's; one that had none gets the upstream's. The upstream serves the blob once (from
// where the peer's right bytes stopped).
func TestPeerFaults(t *testing.T) {
	for _, mode := range []string{peerUnreachable, serve5xx, peerHang, peerStall, serveReset, serveMismatch, peerMismatchUnsent} {
		t.Run(mode, func(t *testing.T) {
			up := startUpstream(t, authNone, "", false)
			layer := randomBytes(2 << 20)
			up.pushImage(t, "team/app", []byte(`{}`), layer)
			d := digest.FromBytes(layer)
			badAddr := freeAddr(t)
			release := make(chan struct{}) // the mismatching peer's rest
			if mode != peerUnreachable {
				badAddr = startBadPeer(t, layer, mode, release)
			}
			files := newCacheFiles(t, up.URL, "", "")
			peerLn := listenLoopback(t)
			self := peerset.Peer{Name: "mirror-test-0", Addr: peerLn.Addr().String()}
			set := peerset.New(self.Name, []peerset.Peer{self, {Name: ownerName(self, badAddr, d), Addr: badAddr}})
			cache := startCacheWith(t, files, Options{Peers: &PeerOptions{Listener: peerLn, Set: set,
				ConnectTimeout: 200 * time.Millisecond, StallTimeout: 300 * time.Millisecond}})
			before := cache.metrics(t)
			blobURL := cache.URL + "/v2/team/app/blobs/" + d.String()

			rng, want, status := "", layer, http.StatusOK
			if mode == peerMismatchUnsent {
				rng, want, status = fmt.Sprintf("bytes=%d-", len(layer)-1), layer[len(layer)-1:], http.StatusPartialContent
			}
			resp := getFrom(context.Background(), t, blobURL, rng, status)
			if resp == nil {
				t.FailNow()
			}
			if mode == serveMismatch {
				// This client has bytes of the peer's answer before the peer sends the wrong part.
				if _, err := io.ReadFull(resp.Body, make([]byte, gateFirst/2)); err != nil {
					t.Fatal(err)
				}
			}
			close(release)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if mode == serveMismatch {
				b = append(make([]byte, gateFirst/2), b...)
				if err == nil {
					t.Errorf("a complete answer of %d bytes from a peer's bytes of another digest", len(b))
				}
				waitMetric(t, cache, fillsInFlightSeries, func(v float64) bool { return v == 0 })
				assertNotStored(t, files, d)
				if n := count(up.requests(), "GET /v2/team/app/blobs/"+d.String()); n != 0 {
					t.Errorf("the upstream was asked %d times before the peer's bytes were refused", n)
				}
				// The next pull: the peer is skipped, the upstream serves.
				resp = getFrom(context.Background(), t, blobURL, "", http.StatusOK)
				if resp == nil {
					t.FailNow()
				}
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err != nil || !bytes.Equal(b, want) {
				t.Fatalf("got %d bytes (%v), not the blob's %d", len(b), err, len(want))
			}
			waitMetric(t, cache, fillsInFlightSeries, func(v float64) bool { return v == 0 })
			if n := count(up.requests(), "GET /v2/team/app/blobs/"+d.String()); n != 1 {
				t.Errorf("the upstream served the blob %d times, want once", n)
			}
			result := map[string]string{peerUnreachable: resultPeerUnreachable, serve5xx: resultPeerError, peerHang: resultPeerStalled,
				peerStall: resultPeerStalled, serveReset: resultPeerCut, serveMismatch: resultPeerMismatch, peerMismatchUnsent: resultPeerMismatch}[mode]
			fromUpstream := len(layer)
			if mode == peerStall || mode == serveReset {
				fromUpstream -= gateFirst // the peer's first bytes were right
			}
			if d := delta(before, cache.metrics(t), peerResult(result), upstreamBlobBytes, fillsOK); d[peerResult(result)] != 1 || d[upstreamBlobBytes] != float64(fromUpstream) || d[fillsOK] != 1 {
				t.Errorf("metric changes %v: want one peer request %s, %d bytes from the upstream, one fill", d, result, fromUpstream)
			}
			if !stored(files, d) {
				t.Error("the blob was not stored")
			}
		})
	}
}

// ownerName names the stand-in peer so that it owns d (self being the other member).
func ownerName(self peerset.Peer, addr string, d digest.Digest) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("mirror-test-%d", i+1)
		if p, ok := peerset.New(self.Name, []peerset.Peer{self, {Name: name, Addr: addr}}).Owner(d.String()); ok && p.Name == name {
			return name
		}
	}
}

// startBadPeer serves b on a peer port the way mode says a broken replica does; a mismatching
// one sends its right first part, then waits for release before the wrong rest.
func startBadPeer(t *testing.T, b []byte, mode string, release chan struct{}) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode {
		case serve5xx:
			http.Error(w, "peer trouble", http.StatusInternalServerError)
			return
		case peerHang:
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		w.WriteHeader(http.StatusOK)
		switch mode {
		case peerMismatchUnsent:
			_, _ = w.Write(randomBytes(len(b)))
			return
		case serveMismatch:
			_, _ = w.Write(b[:gateFirst])
			_ = http.NewResponseController(w).Flush()
			<-release
			_, _ = w.Write(randomBytes(len(b) - gateFirst))
			return
		}
		_, _ = w.Write(b[:gateFirst])
		_ = http.NewResponseController(w).Flush()
		if mode == serveReset {
			panic(http.ErrAbortHandler)
		}
		<-r.Context().Done() // peerStall
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// The peer port serves content by digest only, and a request on it is never sent on to another
// replica, even one that owns the digest: it is filled from the upstream (no loop, and no path
// to anything the registry port does not serve).
func TestPeerPortServesContentByDigestOnly(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	img := up.push(t, "team/app")
	files := newCacheFiles(t, up.URL, "", "")
	var asked sync.Mutex
	askedPaths := []string{}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Lock()
		askedPaths = append(askedPaths, r.URL.Path)
		asked.Unlock()
		http.Error(w, "should not be asked", http.StatusInternalServerError)
	}))
	t.Cleanup(other.Close)
	peerLn := listenLoopback(t)
	self := peerset.Peer{Name: "mirror-test-0", Addr: peerLn.Addr().String()}
	layer := img.blobs[1].Digest
	members := []peerset.Peer{self, {Name: ownerName(self, other.Listener.Addr().String(), layer), Addr: other.Listener.Addr().String()}}
	startCacheWith(t, files, Options{Peers: &PeerOptions{Listener: peerLn, Set: peerset.New(self.Name, members)}})
	peerURL := "http://" + peerLn.Addr().String()

	for _, path := range []string{"/v2/", "/v2/_catalog", "/v2/team/app/tags/list", "/v2/team/app/manifests/" + testTag, "/"} {
		resp, err := testClient.Get(peerURL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s on the peer port: %s, want 404", path, resp.Status)
		}
	}
	resp := getFrom(context.Background(), t, peerURL+"/v2/team/app/blobs/"+layer.String(), "", http.StatusOK)
	if resp == nil {
		t.FailNow()
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || digest.FromBytes(b) != layer {
		t.Errorf("the blob on the peer port: %d bytes (%v)", len(b), err)
	}
	if n := count(up.requests(), "GET /v2/team/app/blobs/"+layer.String()); n != 1 {
		t.Errorf("the upstream served the blob %d times, want once", n)
	}
	asked.Lock()
	defer asked.Unlock()
	if len(askedPaths) != 0 {
		t.Errorf("a peer's request was sent on to the owner: %q", askedPaths)
	}
}

// Two replicas that each think the other owns a digest (their peer sets differ for a moment in
// a rollout) must not wait on each other: a peer's request that joins a fill reading from a peer
// sends that fill to the upstream at once. Here the owner hangs and the stall timeout is an
// hour: both clients are served only if the peer's request moved the fill.
func TestPeerRequestSendsItsFillToTheUpstream(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(1 << 20)
	up.pushImage(t, "team/app", []byte(`{}`), layer)
	d := digest.FromBytes(layer)
	asked := make(chan struct{}, 1)
	owner := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		asked <- struct{}{}
		<-r.Context().Done()
	}))
	t.Cleanup(owner.Close)
	files := newCacheFiles(t, up.URL, "", "")
	peerLn := listenLoopback(t)
	self := peerset.Peer{Name: "mirror-test-0", Addr: peerLn.Addr().String()}
	set := peerset.New(self.Name, []peerset.Peer{self, {Name: ownerName(self, owner.Listener.Addr().String(), d), Addr: owner.Listener.Addr().String()}})
	cache := startCacheWith(t, files, Options{Peers: &PeerOptions{Listener: peerLn, Set: set, StallTimeout: time.Hour}})
	before := cache.metrics(t)

	var wg sync.WaitGroup
	bodies := make([][]byte, 2)
	get := func(i int, url string) {
		if resp := getFrom(context.Background(), t, url+"/v2/team/app/blobs/"+d.String(), "", http.StatusOK); resp != nil {
			bodies[i], _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}
	wg.Go(func() { get(0, cache.URL) }) // a node's pull: the fill asks the owner, which hangs
	<-asked
	wg.Go(func() { get(1, "http://"+peerLn.Addr().String()) }) // another replica's request
	wg.Wait()
	for i, b := range bodies {
		if !bytes.Equal(b, layer) {
			t.Errorf("client %d got %d bytes, not the blob", i, len(b))
		}
	}
	if n := count(up.requests(), "GET /v2/team/app/blobs/"+d.String()); n != 1 {
		t.Errorf("the upstream served the blob %d times, want once", n)
	}
	if dl := delta(before, cache.metrics(t), peerResult(resultPeerCanceled)); dl[peerResult(resultPeerCanceled)] != 1 {
		t.Errorf("metric changes %v: want the owner's request counted canceled", dl)
	}
	if up, down := set.Counts(); up != 1 || down != 0 {
		t.Errorf("the owner was skipped (up %d, down %d): it did not fail, the fill was moved", up, down)
	}
}

// A replica serves nothing before its first lookup of the replicas ended: until then it knows no
// other, and would fetch every pull it served from the upstream itself, owner or not. Here that
// lookup hangs until its deadline (a DNS server that does not answer): the registry port must not
// serve meanwhile (its listener is not yet accepting), and serves once the lookup gave up.
func TestReplicaServesOnceItLookedUpTheOthers(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	files := newCacheFiles(t, up.URL, "", "")
	serving := make(chan struct{})
	lookupEnded := make(chan struct{})
	var early atomic.Bool
	ln := &acceptHook{Listener: listenLoopback(t), first: func() {
		select {
		case <-lookupEnded:
		default:
			early.Store(true)
		}
		close(serving)
	}}
	var lookups atomic.Int32
	lookup := func(ctx context.Context) ([]peerset.Peer, error) {
		if lookups.Add(1) > 1 {
			return nil, nil
		}
		defer close(lookupEnded)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-serving:
			return nil, errors.New("served before the first lookup ended")
		}
	}
	startCacheWith(t, files, Options{Listener: ln, Peers: &PeerOptions{Listener: listenLoopback(t),
		Set: peerset.New("mirror-test-0", nil), Lookup: lookup, LookupTimeout: 200 * time.Millisecond}})
	if early.Load() {
		t.Error("the registry port served while the first lookup of the replicas was under way")
	}
}

// acceptHook is a listener that calls first when it is first asked to accept: a server serves.
type acceptHook struct {
	net.Listener
	first func()
	once  sync.Once
}

func (l *acceptHook) Accept() (net.Conn, error) {
	l.once.Do(l.first)
	return l.Listener.Accept()
}

// A cache told to stop (SIGTERM, a scale-down) while it serves a pull on its registry port and
// another replica's on its peer port refuses new connections on both at once, and lets both
// responses finish, whole, within the drain. (The ports were drained one after the other: the
// peer port went on accepting the other replicas' requests while the registry port drained,
// then had no drain left and cut what it served.)
func TestStoppedCacheDrainsEveryPort(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	layer := randomBytes(2 << 20)
	up.pushImage(t, "team/app", []byte(`{}`), layer)
	g := newGate(layer, serveWhole)
	up.setFault(g.fault)
	files := newCacheFiles(t, up.URL, "", "")
	peerLn := listenLoopback(t)
	self := peerset.Peer{Name: "mirror-test-0", Addr: peerLn.Addr().String()}
	cache := startCacheWith(t, files, Options{Peers: &PeerOptions{Listener: peerLn, Set: peerset.New(self.Name, []peerset.Peer{self})}})

	registry, peer := strings.TrimPrefix(cache.URL, "http://"), self.Addr
	var bodies []io.ReadCloser
	for _, addr := range []string{registry, peer} {
		resp := getFrom(context.Background(), t, "http://"+addr+"/v2/team/app/blobs/"+g.d.String(), "", http.StatusOK)
		if resp == nil {
			t.FailNow()
		}
		defer resp.Body.Close()
		if _, err := io.ReadFull(resp.Body, make([]byte, gateFirst/2)); err != nil {
			t.Fatalf("%s: the first bytes did not arrive while the upstream held the rest: %v", addr, err)
		}
		bodies = append(bodies, resp.Body)
	}
	cache.cancel()
	waitRefusing(t, func() bool {
		select {
		case err := <-cache.done:
			cache.done <- err
			return true
		default:
			return false
		}
	}, registry, peer)
	close(g.release)
	for i, body := range bodies {
		rest, err := io.ReadAll(body)
		if err != nil || !bytes.Equal(rest, layer[gateFirst/2:]) {
			t.Errorf("the response on the %s port under way when the cache was told to stop: %d more bytes (%v), not the rest of the blob", []string{"registry", "peer"}[i], len(rest), err)
		}
	}
	cache.stop(t) // Run returns no error: everything drained
}

// waitRefusing waits until every addr refuses connections: the cache told to stop closed its
// ports. It fails when the cache ended first (ended): it kept a port open through the drain.
func waitRefusing(t *testing.T, ended func() bool, addrs ...string) {
	t.Helper()
	for _, addr := range addrs {
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if ended() {
				t.Fatalf("the cache ended before %s refused connections: it kept that port open while it drained", addr)
			}
			if err != nil {
				break
			}
			c.Close()
			time.Sleep(5 * time.Millisecond) // polling interval
		}
	}
}

// isClosed says whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
