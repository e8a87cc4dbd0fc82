package peerset

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/quartermaster-dev/quartermaster/internal/testing/dnstest"
)

func members(n int) []Peer {
	var out []Peer
	for i := range n {
		out = append(out, Peer{Name: fmt.Sprintf("mirror-hub-%d", i), Addr: fmt.Sprintf("10.0.0.%d:5002", i)})
	}
	return out
}

// owners maps each key to the member that owns it (self owns nothing here: self is no member).
func owners(s *Set, keys int) map[string]string {
	out := map[string]string{}
	for i := range keys {
		key := fmt.Sprintf("sha256:%064x", i)
		p, ok := s.Owner(key)
		if !ok {
			out[key] = ""
			continue
		}
		out[key] = p.Name
	}
	return out
}

// Every pod that sees the same members picks the same owner; keys spread evenly; a member added
// or removed moves only about 1/N of the keys, all of them to or from that member.
func TestOwnerRendezvous(t *testing.T) {
	const keys = 30000
	three := owners(New("observer", members(3)), keys)
	reversed := members(3)
	slices.Reverse(reversed)
	if again := owners(New("other-observer", reversed), keys); !maps.Equal(three, again) {
		t.Fatal("two pods with the same members (listed in another order) disagree on owners")
	}
	perOwner := map[string]int{}
	for _, o := range three {
		perOwner[o]++
	}
	for name, n := range perOwner {
		if n < keys/3*9/10 || n > keys/3*11/10 {
			t.Errorf("%s owns %d of %d keys, want about a third", name, n, keys)
		}
	}

	four := owners(New("observer", members(4)), keys)
	moved := 0
	for k, o := range three {
		if four[k] != o {
			moved++
			if four[k] != "mirror-hub-3" {
				t.Fatalf("scaling up moved %s from %s to %s, not to the new member", k, o, four[k])
			}
		}
	}
	if moved < keys/4*9/10 || moved > keys/4*11/10 {
		t.Errorf("scaling 3 → 4 moved %d of %d keys, want about a quarter", moved, keys)
	}

	two := owners(New("observer", members(2)), keys)
	for k, o := range three {
		if o != "mirror-hub-2" && two[k] != o {
			t.Fatalf("scaling down moved %s from %s, which stayed", k, o)
		}
	}
}

// A member that failed is skipped (its keys go to the rendezvous runner-up) until the retry
// time passes; this pod fetches itself what it owns, or everything when it is alone.
func TestOwnerSkipsFailedMembers(t *testing.T) {
	now := time.Unix(1000, 0)
	s := New("mirror-hub-0", members(3))
	s.now = func() time.Time { return now }
	before := owners(s, 3000)
	s.Failed("mirror-hub-1")
	if up, down := s.Counts(); up != 1 || down != 1 {
		t.Errorf("counts up %d down %d, want 1 and 1", up, down)
	}
	during := owners(s, 3000)
	for k, o := range before {
		switch {
		case o == "mirror-hub-1" && during[k] == "mirror-hub-1":
			t.Fatalf("%s still goes to the failed member", k)
		case o != "mirror-hub-1" && during[k] != o:
			t.Fatalf("%s moved from %s, which did not fail", k, o)
		}
	}
	if !slices.Contains(slices.Collect(maps.Values(during)), "") {
		t.Error("self owns no key: this pod never fetches itself")
	}
	now = now.Add(DefaultRetry)
	if after := owners(s, 3000); !maps.Equal(after, before) {
		t.Error("the failed member did not get its keys back after the retry time")
	}
	alone := New("mirror-hub-0", []Peer{{Name: "mirror-hub-0", Addr: "x:1"}})
	if p, ok := alone.Owner("sha256:abc"); ok {
		t.Errorf("a pod alone sends to %v", p)
	}
	if p, ok := New("mirror-hub-0", nil).Owner("sha256:abc"); ok {
		t.Errorf("a pod with no members sends to %v", p)
	}
}

func TestParseList(t *testing.T) {
	got, err := ParseList("b=127.0.0.1:2, a=[::1]:1,")
	if err != nil || !slices.Equal(got, []Peer{{"b", "127.0.0.1:2"}, {"a", "[::1]:1"}}) {
		t.Errorf("ParseList: %v, %v", got, err)
	}
	for _, bad := range []string{"a", "=h:1", "a=host"} {
		if _, err := ParseList(bad); err == nil {
			t.Errorf("ParseList(%q) accepted", bad)
		}
	}
}

// The members come from the SRV records of the headless Service's peer port, as a cluster's DNS
// serves them for a StatefulSet's ready pods, through Go's own resolver against a DNS server
// on loopback: in place when Watch returns, then changed as a pod becomes ready or goes away
// (and only a change is reported); a name that does not exist (no pod ready) means no member,
// and a lookup that fails keeps the last members.
func TestWatchReadsSRVRecords(t *testing.T) {
	const service = "mirror-hub-headless.mirrors.svc.cluster.local"
	dns := dnstest.Start(t)
	pod := func(i int) (dnsmessage.SRVResource, Peer) {
		host := fmt.Sprintf("mirror-hub-%d.%s", i, service)
		return dnstest.SRV(host, 5002), Peer{fmt.Sprintf("mirror-hub-%d", i), host + ":5002"}
	}
	srv0, peer0 := pod(0)
	srv1, peer1 := pod(1)
	srv2, peer2 := pod(2)
	dns.SetSRV("_peer._tcp."+service, srv0, srv1)
	resolver := dnstest.Resolver(dns.Addr)
	s := New("mirror-hub-0", nil)
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan []Peer, 10)
	errs := make(chan error, 10)
	s.Watch(ctx, LookupSRV(resolver, "peer", service), 10*time.Millisecond, time.Minute, func(m []Peer) { changes <- m }, func(err error) { errs <- err })
	if !slices.Equal(s.Members(), []Peer{peer0, peer1}) {
		t.Fatalf("Watch returned with the members %v, before its first lookup's were in place", s.Members())
	}
	next := func(want ...Peer) {
		t.Helper()
		select {
		case err := <-errs:
			t.Fatal(err)
		case got := <-changes:
			slices.SortFunc(got, func(a, b Peer) int { return strings.Compare(a.Name, b.Name) })
			if !slices.Equal(got, want) || !slices.Equal(s.Members(), want) {
				t.Fatalf("members changed to %v (set %v), want %v", got, s.Members(), want)
			}
		}
	}
	next(peer0, peer1)
	dns.SetSRV("_peer._tcp."+service, srv0, srv1, srv2) // scaled up
	next(peer0, peer1, peer2)
	dns.SetSRV("_peer._tcp."+service, srv0, srv2) // mirror-hub-1 is not ready
	next(peer0, peer2)
	dns.SetSRV("_peer._tcp." + service) // none ready
	next()
	cancel()

	failing := New("x", []Peer{peer0, peer1})
	ctx, cancel = context.WithCancel(context.Background())
	failed := make(chan error, 1)
	failing.Watch(ctx, func(context.Context) ([]Peer, error) { return nil, fmt.Errorf("dns down") }, time.Hour, time.Minute,
		func([]Peer) { t.Error("a failed lookup reported a change") }, func(err error) { failed <- err; cancel() })
	if err := <-failed; err == nil {
		t.Fatal("the failing lookup reported no error")
	}
	if !slices.Equal(failing.Members(), []Peer{peer0, peer1}) {
		t.Errorf("a failed lookup changed the members to %v", failing.Members())
	}
}
