// Package peerset is the set of a registry mirror's cache pods that act as one cache: who they
// are (a fixed list, or the SRV records of the mirror's headless Service, looked up again
// periodically) and which of them owns a digest. Ownership is rendezvous (highest random weight)
// hashing: every pod that sees the same members picks the same owner, and a member joining or
// leaving moves only the keys it gains or held, about 1/N of them.
package peerset

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Peer is one cache pod: its stable name (the pod's name) and where its peer port listens.
type Peer struct {
	Name, Addr string
}

// Set is the members as this pod sees them, minus the ones it found failing lately.
type Set struct {
	self  string
	retry time.Duration
	now   func() time.Time

	mu      sync.Mutex
	members []Peer               // sorted by name
	down    map[string]time.Time // name → when to try it again
}

// DefaultRetry is how long a member that failed is skipped: its keys go to the next owner.
const DefaultRetry = 15 * time.Second

// New returns a set in which self is this pod's name, holding members.
func New(self string, members []Peer) *Set {
	s := &Set{self: self, retry: DefaultRetry, now: time.Now, down: map[string]time.Time{}}
	s.Replace(members)
	return s
}

// Replace sets the members (a new lookup's answer); the failure marks of members that stay are
// kept. It reports whether the members changed.
func (s *Set) Replace(members []Peer) (changed bool) {
	m := slices.Clone(members)
	slices.SortFunc(m, func(a, b Peer) int { return strings.Compare(a.Name, b.Name) })
	m = slices.CompactFunc(m, func(a, b Peer) bool { return a.Name == b.Name })
	s.mu.Lock()
	defer s.mu.Unlock()
	changed = !slices.Equal(s.members, m)
	s.members = m
	for name := range s.down {
		if !slices.ContainsFunc(m, func(p Peer) bool { return p.Name == name }) {
			delete(s.down, name)
		}
	}
	return changed
}

// Owner is the member that owns key among those not failing. ok is false when this pod should
// fetch the key itself: it owns it, or no other member is left.
func (s *Set) Owner(key string) (owner Peer, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var best uint64
	found := false
	for _, p := range s.members {
		if until, isDown := s.down[p.Name]; isDown && now.Before(until) {
			continue
		}
		if w := weight(p.Name, key); !found || w > best {
			owner, best, found = p, w, true
		}
	}
	if !found || owner.Name == s.self {
		return Peer{}, false
	}
	return owner, true
}

// Others are the members other than this pod that are not failing, in the order they own key
// (the owner first): whom to ask, one after the other, for what any of them may know.
func (s *Set) Others(key string) []Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []Peer
	for _, p := range s.members {
		if until, isDown := s.down[p.Name]; p.Name == s.self || (isDown && now.Before(until)) {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return cmp.Compare(weight(b.Name, key), weight(a.Name, key)) })
	return out
}

// Failed marks a member as failing: its keys go to the next owner for a while.
func (s *Set) Failed(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[name] = s.now().Add(s.retry)
}

// Counts are how many other members are up and how many were skipped as failing.
func (s *Set) Counts() (up, down int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, p := range s.members {
		switch {
		case p.Name == s.self:
		case now.Before(s.down[p.Name]):
			down++
		default:
			up++
		}
	}
	return up, down
}

// weight is the rendezvous weight of key at member name: FNV-1a, then a 64-bit finalizer so
// that names differing in one character spread well.
func weight(name, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(key))
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// ParseList reads a fixed member list: "name=host:port,name=host:port".
func ParseList(list string) ([]Peer, error) {
	var out []Peer
	for item := range strings.SplitSeq(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("peer %q is not name=host:port", item)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("peer %q: %w", item, err)
		}
		out = append(out, Peer{Name: name, Addr: addr})
	}
	return out, nil
}

// LookupSRV returns the members behind a headless Service's port named port (the SRV records
// _<port>._tcp.<service>): one record per ready pod, whose
// target is <pod>.<service>.<namespace>.svc.<zone>. (a StatefulSet's pods have a hostname), so
// the first label is the pod's name, stable across restarts. A name that does not exist means no
// member is ready: none.
func LookupSRV(r *net.Resolver, port, service string) func(context.Context) ([]Peer, error) {
	return func(ctx context.Context) ([]Peer, error) {
		_, records, err := r.LookupSRV(ctx, port, "tcp", service)
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		out := make([]Peer, 0, len(records))
		for _, rec := range records {
			host := strings.TrimSuffix(rec.Target, ".")
			name, _, _ := strings.Cut(host, ".")
			out = append(out, Peer{Name: name, Addr: net.JoinHostPort(host, strconv.Itoa(int(rec.Port)))})
		}
		return out, nil
	}
}

// Watch replaces the members with lookup's answer now and every interval until ctx ends, and
// tells onChange the new members when they changed. A lookup that fails or takes longer than
// timeout keeps the members it had (told to onError). It returns once the first lookup ended,
// answered or not, and looks up again in the background: a pod that served before it knew the
// others would fetch all it misses itself.
func (s *Set) Watch(ctx context.Context, lookup func(context.Context) ([]Peer, error), interval, timeout time.Duration, onChange func([]Peer), onError func(error)) {
	refresh := func() {
		lctx, cancel := context.WithTimeout(ctx, timeout)
		members, err := lookup(lctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			onError(err)
		case err == nil && s.Replace(members):
			onChange(members)
		}
	}
	refresh()
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				refresh()
			}
		}
	}()
}
