package mirrorcache

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/quartermaster-dev/quartermaster/internal/mirror"
	"github.com/quartermaster-dev/quartermaster/internal/testing/dnstest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// The replicas change while pulls run, as `kubectl scale` changes them. Each replica finds the
// others as the registry-mirror subcommand does with --peers-service: the SRV records of the
// headless Service's peer port, looked up again and again (peerset.LookupSRV and Set.Watch, as
// Run wires them), here from a DNS server on loopback that the test changes as a cluster's DNS
// changes when a pod becomes ready or goes away.

// The mirror's headless Service as the replicas name it (mirror.PeersService), and the domain
// of its pods' host names (the SRV records' targets).
const (
	testPeersService = "mirror-test-headless.quartermaster-mirrors.svc"
	testPodDomain    = testPeersService + ".cluster.local"
)

// headless is the cluster's DNS for the mirror's headless Service.
type headless struct{ dns *dnstest.Server }

func startHeadless(t *testing.T) *headless { return &headless{dns: dnstest.Start(t)} }

// ready makes rs the ready pods: the SRV records of the peer port list them, and their host
// names resolve (to loopback: every replica listens there, on its own port).
func (h *headless) ready(t *testing.T, rs ...*replica) {
	t.Helper()
	var records []dnsmessage.SRVResource
	for _, r := range rs {
		_, port, err := net.SplitHostPort(r.peerAddr)
		if err != nil {
			t.Fatal(err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			t.Fatal(err)
		}
		host := r.name + "." + testPodDomain
		h.dns.SetA(host, netip.MustParseAddr("127.0.0.1"))
		records = append(records, dnstest.SRV(host, uint16(p)))
	}
	h.dns.SetSRV("_"+mirror.PeerPortName+"._tcp."+testPeersService, records...)
}

// startLookingUp runs r as its own process finding the replicas through h.
func (h *headless) startLookingUp(t *testing.T, r *replica) {
	t.Helper()
	r.start(t, envChildPeersService+"="+testPeersService, envChildDNS+"="+h.dns.Addr)
}

// waitPeers waits until each of rs has looked up members as the replicas: the last change of its
// peers that it logged names them.
func waitPeers(t *testing.T, rs []*replica, members ...*replica) {
	t.Helper()
	var names []string
	for _, m := range members {
		names = append(names, m.name)
	}
	want := `"peers":"` + strings.Join(names, ",") + `"`
	// One limit for all: the replicas are checked in turn, each until its last change names them.
	i := 0
	testenv.PollFor(t, fmt.Sprintf("each replica to see the replicas %v", names), 5*time.Millisecond, 30*time.Second, func() (bool, string) {
		for ; i < len(rs); i++ {
			last := ""
			for _, l := range strings.Split(rs[i].logs.String(), "\n") {
				if strings.Contains(l, "cache peers changed") {
					last = l
				}
			}
			if !strings.Contains(last, want) {
				return false, fmt.Sprintf("%s's last change: %s", rs[i].name, last)
			}
		}
		return true, ""
	})
}

// blobsWhere returns n random blobs of size bytes whose digest satisfies ok.
func blobsWhere(n, size int, ok func(digest.Digest) bool) [][]byte {
	var out [][]byte
	for len(out) < n {
		if b := randomBytes(size); ok(digest.FromBytes(b)) {
			out = append(out, b)
		}
	}
	return out
}

// heldSize is the size of the blobs pulled across a change: more than a gate lets through.
const heldSize = gateFirst + 256<<10

// movingBlobs returns the blobs pulled across a change: 3 whose owner changes (moves) and 5
// whose owner stays.
func movingBlobs(moves func(digest.Digest) bool) (moved, stayed [][]byte) {
	return blobsWhere(3, heldSize, moves), blobsWhere(5, heldSize, func(d digest.Digest) bool { return !moves(d) })
}

// gateAll holds the first upstream GET of each blob after gateFirst bytes (gatedBlob) until
// release.
func gateAll(up *upstream, blobs [][]byte) (release func()) {
	var gates []*gatedBlob
	for _, b := range blobs {
		gates = append(gates, newGate(b, serveWhole))
	}
	up.setFault(func(w http.ResponseWriter, r *http.Request) bool {
		for _, g := range gates {
			if g.fault(w, r) {
				return true
			}
		}
		return false
	})
	return func() {
		for _, g := range gates {
			close(g.release)
		}
	}
}

// pullOf is one client's pull of blob b through replica r.
type pullOf struct {
	r *replica
	b []byte
}

// each is clients pulls of every blob through every replica of rs.
func each(rs []*replica, blobs [][]byte, clients int) []pullOf {
	var out []pullOf
	for _, b := range blobs {
		for _, r := range rs {
			for range clients {
				out = append(out, pullOf{r, b})
			}
		}
	}
	return out
}

// pullRead is a pull begun: its response and the first bytes read.
type pullRead struct {
	pullOf
	resp *http.Response
	head []byte
}

// begin sends the pull's GET and reads the first head bytes of the blob.
func (p pullOf) begin(head int) (*pullRead, error) {
	d := digest.FromBytes(p.b)
	resp, err := testClient.Get("http://" + p.r.addr + "/v2/team/app/blobs/" + d.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", p.r.name, d, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: %s %q", p.r.name, d, resp.Status, b)
	}
	pr := &pullRead{pullOf: p, resp: resp, head: make([]byte, head)}
	if _, err := io.ReadFull(resp.Body, pr.head); err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: the first bytes of %s did not arrive while the upstream held the rest: %w", p.r.name, d, err)
	}
	return pr, nil
}

// beginPulls begins the pulls all at once; when it returns each has its first bytes (its fill
// under way, the rest held at the upstream).
func beginPulls(t *testing.T, pulls []pullOf) []*pullRead {
	t.Helper()
	var mu sync.Mutex
	var out []*pullRead
	var errs []error
	var wg sync.WaitGroup
	for _, p := range pulls {
		wg.Go(func() {
			pr, err := p.begin(256 << 10)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out = append(out, pr)
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		for _, pr := range out {
			pr.resp.Body.Close()
		}
		t.Fatal(errors.Join(errs...))
	}
	return out
}

// finish reads the rest: the whole blob with its digest checked, or the error.
func (p *pullRead) finish() error {
	defer p.resp.Body.Close()
	rest, err := io.ReadAll(p.resp.Body)
	got := slices.Concat(p.head, rest)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %s cut after %d bytes: %w", p.r.name, digest.FromBytes(p.b), len(got), err)
	case len(got) != len(p.b) || digest.FromBytes(got) != digest.FromBytes(p.b):
		return fmt.Errorf("%s: %s: %d bytes of digest %s", p.r.name, digest.FromBytes(p.b), len(got), digest.FromBytes(got))
	}
	return nil
}

// pullAll makes the pulls all at once, each whole and digest checked.
func pullAll(t *testing.T, pulls []pullOf) {
	t.Helper()
	var wg sync.WaitGroup
	for _, p := range pulls {
		wg.Go(func() {
			pr, err := p.begin(0)
			if err == nil {
				err = pr.finish()
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// sizeOf adds the blobs' sizes whose digest satisfies ok.
func sizeOf(blobs [][]byte, ok func(digest.Digest) bool) float64 {
	n := 0
	for _, b := range blobs {
		if ok(digest.FromBytes(b)) {
			n += len(b)
		}
	}
	return float64(n)
}

// upstreamGETs counts the upstream's GETs of each blob in seen.
func upstreamGETs(seen []string, blobs [][]byte) map[digest.Digest]int {
	out := map[digest.Digest]int{}
	for _, b := range blobs {
		d := digest.FromBytes(b)
		out[d] = count(seen, "GET /v2/team/app/blobs/"+d.String())
	}
	return out
}

// assertOwnersFill is what a change of the replicas leaves: fresh blobs (never pulled), pulled
// through every replica of rs at once, are fetched from the upstream once each, by their owner
// among rs (rendezvous hashing), and each other replica reads them from that owner once, with no
// request to a peer failing; then img pulls through each replica with no blob from the upstream
// (every blob of it was pulled through every replica).
func assertOwnersFill(t *testing.T, up *upstream, rs []*replica, fresh [][]byte, img testImage) {
	t.Helper()
	before := map[*replica]map[string]float64{}
	for _, r := range rs {
		before[r] = r.metrics(t)
	}
	pullAll(t, each(rs, fresh, 1))
	waitFillsDone(t, rs)
	for d, n := range upstreamGETs(up.requests(), fresh) {
		if n != 1 {
			t.Errorf("the upstream served %s (owner %s) %d times, want once", d, ownerOf(rs, d).name, n)
		}
	}
	failed := []string{peerResult(resultPeerRefused), peerResult(resultPeerError), peerResult(resultPeerUnreachable),
		peerResult(resultPeerStalled), peerResult(resultPeerCut), peerResult(resultPeerMismatch), peerResult(resultPeerCanceled)}
	for _, r := range rs {
		owns := func(d digest.Digest) bool { return ownerOf(rs, d) == r }
		d := delta(before[r], r.metrics(t), append([]string{upstreamBlobBytes, peerBlobBytes}, failed...)...)
		if want := sizeOf(fresh, owns); d[upstreamBlobBytes] != want {
			t.Errorf("%s read %v bytes of the new blobs from the upstream, want the %v of those it owns", r.name, d[upstreamBlobBytes], want)
		}
		if want := sizeOf(fresh, func(d digest.Digest) bool { return !owns(d) }); d[peerBlobBytes] != want {
			t.Errorf("%s read %v bytes of the new blobs from its peers, want the %v of those it does not own", r.name, d[peerBlobBytes], want)
		}
		for _, s := range failed {
			if d[s] != 0 {
				t.Errorf("%s: %s rose by %v", r.name, s, d[s])
			}
		}
	}
	for _, r := range rs {
		hosts := t.TempDir()
		writeHostsDir(t, hosts, up, "http://"+r.addr)
		mustPull(t, hosts, img.byTag(up))
	}
	for _, s := range up.requests() {
		if strings.Contains(s, "/blobs/") {
			t.Errorf("the image pulled through every replica made the upstream serve %q: they hold every blob", s)
		}
	}
}

// startMirror runs rs as the ready pods of the mirror, each finding the others through h, and
// waits until each has found them all.
func (h *headless) startMirror(t *testing.T, rs ...*replica) {
	t.Helper()
	h.ready(t, rs...)
	for _, r := range rs {
		h.startLookingUp(t, r)
	}
	waitPeers(t, rs, rs...)
}

// assertFetchedOnce checks that the upstream served each blob, whose owner among rs stayed, once
// (gets: its GETs by digest).
func assertFetchedOnce(t *testing.T, gets map[digest.Digest]int, blobs [][]byte, rs []*replica) {
	t.Helper()
	for _, b := range blobs {
		if d := digest.FromBytes(b); gets[d] != 1 {
			t.Errorf("the upstream served %s, whose owner stayed %s, %d times: want once", d, ownerOf(rs, d).name, gets[d])
		}
	}
}

// A mirror scaled from 2 replicas to 3 while many clients pull several blobs through it: the
// new pod starts (in no one's set, its own included, until ready) and becomes ready while every
// blob is being filled on the old replicas; pulls reach it before any pod's lookup lists it,
// then go on through all three at once while they learn of it (their views differ) and after.
// Every pull gets the whole blob, right. The upstream serves a blob that stayed with its owner once, and one that moved to
// the new pod at most twice, once by its old owner and once by its new one: the old replicas read
// from the upstream exactly the blobs they owned before, the new one at most those it gained; a
// moved blob first asked of the new pod once all see it while its old owner still fills it is
// fetched by both. Then blobs never pulled are fetched once each, by their owners among the
// three (the new pod's included), each other replica reading them from their owner; and the
// whole image pulls through each replica with no blob from the upstream.
func TestReplicasScaleUpWhilePulling(t *testing.T) {
	up := startUpstream(t, authNone, "", false)
	dns := startHeadless(t)
	rs := newReplicas(t, up, 3)
	before, added := rs[:2], rs[2]
	gains := func(d digest.Digest) bool { return ownerOf(rs, d) == added }
	moved, stayed := movingBlobs(gains)
	late := blobsWhere(1, heldSize, gains)
	var fresh [][]byte
	for _, r := range rs {
		fresh = append(fresh, blobsWhere(1, 256<<10, func(d digest.Digest) bool { return ownerOf(rs, d) == r })...)
	}
	held := append(append([][]byte{}, moved...), stayed...)
	all := append(append([][]byte{}, held...), late...)
	config := fresh[0] // any blob to the cache: pulled as a fresh one
	img := up.pushImage(t, "team/app", config, append(append([][]byte{}, all...), fresh[1:]...)...)
	release := gateAll(up, all)

	dns.startMirror(t, before...)
	// The new pod starts (it serves once it looked the others up); not ready yet, it is in no
	// one's set, its own included.
	dns.startLookingUp(t, added)

	start := time.Now()
	var first []pullOf // each blob through one old replica, late through both
	for i, b := range held {
		first = append(first, each(before[i%2:i%2+1], [][]byte{b}, 2)...)
	}
	pulls := beginPulls(t, append(first, each(before, late, 2)...))
	// The new pod is ready: nodes reach it through the Service before any pod's lookup lists
	// it (its own included), so it asks the old owners.
	pulls = append(pulls, beginPulls(t, each([]*replica{added}, held, 2))...)
	dns.ready(t, rs...)
	pulls = append(pulls, beginPulls(t, each(rs, held, 1))...)
	waitPeers(t, rs, rs...)
	pulls = append(pulls, beginPulls(t, each(rs, all, 1))...)
	t.Logf("the fills were held %s across the change", time.Since(start).Round(time.Millisecond))
	release()
	for _, p := range pulls {
		if err := p.finish(); err != nil {
			t.Error(err)
		}
	}
	waitFillsDone(t, rs)

	gets := upstreamGETs(up.requests(), all)
	assertFetchedOnce(t, gets, stayed, before)
	for _, b := range moved {
		if d := digest.FromBytes(b); gets[d] < 1 || gets[d] > 2 {
			t.Errorf("the upstream served %s, moved from %s to %s, %d times: want once or twice", d, ownerOf(before, d).name, added.name, gets[d])
		}
	}
	if d := digest.FromBytes(late[0]); gets[d] != 2 {
		t.Errorf("the upstream served %s, asked of its new owner %s while %s filled it, %d times: want twice, once by each", d, added.name, ownerOf(before, d).name, gets[d])
	}
	for _, r := range before {
		owned := sizeOf(all, func(d digest.Digest) bool { return ownerOf(before, d) == r })
		if got := r.metrics(t)[upstreamBlobBytes]; got != owned {
			t.Errorf("%s read %v bytes from the upstream, want the %v of the blobs it owned before the change", r.name, got, owned)
		}
	}
	if got, least, most := added.metrics(t)[upstreamBlobBytes], float64(len(late[0])), sizeOf(all, gains); got < least || got > most {
		t.Errorf("%s read %v bytes from the upstream, want at least the late blob's %v and at most the %v of the blobs it gained", added.name, got, least, most)
	}

	assertOwnersFill(t, up, rs, fresh, img)
}

// A mirror scaled from 3 replicas to 2 while many clients pull several blobs through it: the
// removed pod is stopped (SIGTERM) while it fills the blobs it owns and the other replicas
// stream them from it; pulls go on through the two others at once, first while they still count
// it (it refuses their connections: they skip it), then after the DNS dropped it. Terminated,
// it drains: every pull, its own clients' too, gets the whole blob. Killed mid-fill as well
// (SIGKILL, the kubelet's end of the grace period): the other replicas' clients still get whole,
// right blobs, its own see their responses cut. Either way the upstream serves a blob that
// stayed with its owner once, and one the removed pod owned twice: its fill, and its new
// owner's (from where it was, when it had been streaming it from the removed pod). Then blobs
// the removed pod owned, never pulled, are fetched once each by their new owners, and the whole
// image pulls through each replica left with no blob from the upstream.
func TestReplicasScaleDownWhilePulling(t *testing.T) {
	for _, stop := range []string{"terminated", "killed"} {
		t.Run(stop, func(t *testing.T) {
			up := startUpstream(t, authNone, "", false)
			dns := startHeadless(t)
			rs := newReplicas(t, up, 3)
			after, removed := rs[:2], rs[2]
			loses := func(d digest.Digest) bool { return ownerOf(rs, d) == removed }
			moved, stayed := movingBlobs(loses)
			var fresh [][]byte
			for _, r := range after {
				fresh = append(fresh, blobsWhere(1, 256<<10, func(d digest.Digest) bool { return loses(d) && ownerOf(after, d) == r })...)
			}
			held := append(append([][]byte{}, moved...), stayed...)
			img := up.pushImage(t, "team/app", fresh[0], append(append([][]byte{}, held...), fresh[1:]...)...)
			release := gateAll(up, held)

			dns.startMirror(t, rs...)

			start := time.Now()
			var first []pullOf // each blob through the removed pod and one other
			for i, b := range held {
				first = append(first, each([]*replica{removed, after[i%2]}, [][]byte{b}, 2)...)
			}
			pulls := beginPulls(t, first)
			// The pod is deleted: it stops accepting connections (draining what runs) before
			// any pod's lookup drops it, and pulls go on through the others, which still count it.
			if err := removed.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			waitRefusing(t, func() bool { return isClosed(removed.exited) }, removed.addr, removed.peerAddr)
			pulls = append(pulls, beginPulls(t, each(after, held, 1))...)
			dns.ready(t, after...)
			waitPeers(t, after, after...)
			pulls = append(pulls, beginPulls(t, each(after, held, 1))...)
			if stop == "killed" {
				if err := removed.cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				<-removed.exited
			}
			t.Logf("the fills were held %s across the change", time.Since(start).Round(time.Millisecond))
			release()
			for _, p := range pulls {
				err := p.finish()
				switch {
				case p.r != removed || stop == "terminated":
					if err != nil {
						t.Error(err)
					}
				case err == nil:
					t.Errorf("a client of the killed replica got a complete-looking body of %s", digest.FromBytes(p.b))
				}
			}
			<-removed.exited
			if st := removed.cmd.ProcessState; stop == "terminated" && !st.Success() {
				t.Errorf("the terminated replica ended %s\n%s", st, removed.logs.Tail(4000))
			}
			waitFillsDone(t, after)

			gets := upstreamGETs(up.requests(), held)
			assertFetchedOnce(t, gets, stayed, rs)
			for _, b := range moved {
				if d := digest.FromBytes(b); gets[d] != 2 {
					t.Errorf("the upstream served %s, moved from %s to %s, %d times: want twice, once by each", d, removed.name, ownerOf(after, d).name, gets[d])
				}
			}
			for _, r := range after {
				owned := sizeOf(stayed, func(d digest.Digest) bool { return ownerOf(rs, d) == r })
				gained := sizeOf(moved, func(d digest.Digest) bool { return ownerOf(after, d) == r })
				if got := r.metrics(t)[upstreamBlobBytes]; got < owned || got > owned+gained {
					t.Errorf("%s read %v bytes from the upstream, want the %v of the blobs it owned, and at most the %v of those it gained", r.name, got, owned, gained)
				}
			}

			assertOwnersFill(t, up, after, fresh, img)
		})
	}
}
