// Package dnstest is a DNS server on loopback for tests: it answers as a cluster's DNS answers
// for a headless Service, the SRV records of a port (one per ready pod) and the A records of
// their targets, from records a test sets and changes while it runs. Resolver points Go's own
// resolver at it.
package dnstest

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers SRV and A questions over UDP from its records; a name it has no record of does
// not exist (NXDOMAIN), and a question of another type about a name it knows has no answer.
type Server struct {
	// Addr is where it listens (UDP, host:port).
	Addr string

	pc  net.PacketConn
	mu  sync.Mutex
	srv map[string][]dnsmessage.SRVResource // by fully qualified name, lower case
	a   map[string]netip.Addr
}

// Start runs a server until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: pc.LocalAddr().String(), pc: pc, srv: map[string][]dnsmessage.SRVResource{}, a: map[string]netip.Addr{}}
	t.Cleanup(func() { pc.Close() })
	go s.serve()
	return s
}

// SRV is one SRV record of a headless Service's port: a pod's host name and its port.
func SRV(target string, port uint16) dnsmessage.SRVResource {
	return dnsmessage.SRVResource{Priority: 0, Weight: 50, Port: port, Target: dnsmessage.MustNewName(fqdn(target))}
}

// SetSRV makes name's SRV records records; none: the name does not exist.
func (s *Server) SetSRV(name string, records ...dnsmessage.SRVResource) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(records) == 0 {
		delete(s.srv, fqdn(name))
		return
	}
	s.srv[fqdn(name)] = records
}

// SetA makes name's address ip (IPv4).
func (s *Server) SetA(name string, ip netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.a[fqdn(name)] = ip
}

// Resolver is Go's resolver sending every question to the server at addr (a Server's Addr),
// whatever the system's configuration names.
func Resolver(addr string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", addr)
	}}
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

func (s *Server) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if msg, ok := s.answer(buf[:n]); ok {
			_, _ = s.pc.WriteTo(msg, from)
		}
	}
}

// answer builds the reply to one query; false for a message that is no query.
func (s *Server) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.ToLower(q.Name.String())
	s.mu.Lock()
	srv, hasSRV := s.srv[name]
	a, hasA := s.a[name]
	s.mu.Unlock()
	rcode := dnsmessage.RCodeSuccess
	if !hasSRV && !hasA {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: rcode})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
	switch {
	case q.Type == dnsmessage.TypeSRV:
		for _, r := range srv {
			_ = b.SRVResource(rh, r)
		}
	case q.Type == dnsmessage.TypeA && hasA:
		_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
	}
	msg, err := b.Finish()
	return msg, err == nil
}
