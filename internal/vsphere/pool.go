package vsphere

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Pool is a group's static IPv4 addresses: the network they are in, the ones to hand out (as
// inclusive ranges, never expanded: a /8 is 16 million addresses), the gateway and name servers.
type Pool struct {
	Network     netip.Prefix
	Gateway     netip.Addr // invalid: no default route
	Nameservers []netip.Addr
	ranges      []addrRange // sorted, disjoint, within Network
}

type addrRange struct{ first, last netip.Addr }

// ParsePool checks a pool as written: an IPv4 network (CIDR), addresses and ranges within it
// ("" list: the network's addresses but its first and last), a gateway within it. Errors name the
// entry at fault, for a person.
func ParsePool(network string, addresses []string, gateway string, nameservers []string) (Pool, error) {
	var p Pool
	pfx, err := netip.ParsePrefix(network)
	if err != nil || !pfx.Addr().Is4() {
		return p, fmt.Errorf("network %q is not an IPv4 CIDR such as 10.20.0.0/24", network)
	}
	if pfx.Bits() > 30 {
		return p, fmt.Errorf("network %q leaves no address to hand out: its prefix must be /30 or shorter", network)
	}
	p.Network = pfx.Masked()
	if gateway != "" {
		if p.Gateway, err = netip.ParseAddr(gateway); err != nil || !p.Network.Contains(p.Gateway) {
			return p, fmt.Errorf("gateway %q is not an address of network %s", gateway, p.Network)
		}
	}
	for _, ns := range nameservers {
		a, err := netip.ParseAddr(ns)
		if err != nil || !a.Is4() {
			return p, fmt.Errorf("name server %q is not an IPv4 address", ns)
		}
		p.Nameservers = append(p.Nameservers, a)
	}
	first, last := p.Network.Addr(), broadcast(p.Network)
	if len(addresses) == 0 {
		p.ranges = []addrRange{{first.Next(), last.Prev()}}
		return p, nil
	}
	for _, entry := range addresses {
		lo, hi, isRange := strings.Cut(entry, "-")
		r := addrRange{}
		if r.first, err = netip.ParseAddr(lo); err != nil || !r.first.Is4() {
			return p, fmt.Errorf("address %q is not an IPv4 address or range", entry)
		}
		r.last = r.first
		if isRange {
			if r.last, err = netip.ParseAddr(hi); err != nil || !r.last.Is4() || r.last.Less(r.first) {
				return p, fmt.Errorf("address range %q is not first-last, two IPv4 addresses in order", entry)
			}
		}
		if !p.Network.Contains(r.first) || !p.Network.Contains(r.last) {
			return p, fmt.Errorf("address %q is not within network %s", entry, p.Network)
		}
		if r.first == first || r.last == last {
			return p, fmt.Errorf("address %q holds the network's own or its broadcast address", entry)
		}
		p.ranges = append(p.ranges, r)
	}
	slices.SortFunc(p.ranges, func(a, b addrRange) int { return a.first.Compare(b.first) })
	merged := p.ranges[:1]
	for _, r := range p.ranges[1:] {
		last := &merged[len(merged)-1]
		if !last.last.Less(r.first.Prev()) { // overlapping or adjacent
			if last.last.Less(r.last) {
				last.last = r.last
			}
			continue
		}
		merged = append(merged, r)
	}
	p.ranges = merged
	return p, nil
}

func broadcast(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(b)
}

// Contains reports whether a is one of the pool's addresses (never the gateway).
func (p Pool) Contains(a netip.Addr) bool {
	if a == p.Gateway {
		return false
	}
	for _, r := range p.ranges {
		if !a.Less(r.first) && !r.last.Less(a) {
			return true
		}
	}
	return false
}

// Size is how many addresses the pool hands out.
func (p Pool) Size() int64 {
	var n int64
	for _, r := range p.ranges {
		n += int64(u32(r.last)-u32(r.first)) + 1
	}
	for _, r := range p.ranges { // the gateway is never handed out
		if p.Gateway.IsValid() && !p.Gateway.Less(r.first) && !r.last.Less(p.Gateway) {
			n--
		}
	}
	return n
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// Next is the lowest address of the pool that taken does not reject, or false when there is none.
// It looks at most at taken's count plus one addresses of each range.
func (p Pool) Next(taken func(netip.Addr) bool) (netip.Addr, bool) {
	for _, r := range p.ranges {
		for a := r.first; ; a = a.Next() {
			if a != p.Gateway && !taken(a) {
				return a, true
			}
			if a == r.last {
				break
			}
		}
	}
	return netip.Addr{}, false
}

// Fingerprint identifies what every VM of the group gets alike (network, gateway, name servers;
// not the addresses): a change of it replaces the VMs.
func (p Pool) Fingerprint() string {
	ns := make([]string, len(p.Nameservers))
	for i, a := range p.Nameservers {
		ns[i] = a.String()
	}
	return p.Network.String() + "|" + p.Gateway.String() + "|" + strings.Join(ns, ",")
}

// NetworkConfig is the cloud-init network configuration (netplan version 2) giving the adapter of
// the MAC address the static address addr: the guest's metadata "network" key, as cloud-init's
// VMware datasource reads it.
func (p Pool) NetworkConfig(mac string, addr netip.Addr) map[string]any {
	eth := map[string]any{
		"match":     map[string]any{"macaddress": strings.ToLower(mac)},
		"dhcp4":     false,
		"dhcp6":     false,
		"addresses": []any{netip.PrefixFrom(addr, p.Network.Bits()).String()},
	}
	if p.Gateway.IsValid() {
		eth["routes"] = []any{map[string]any{"to": "0.0.0.0/0", "via": p.Gateway.String()}}
	}
	if len(p.Nameservers) > 0 {
		var ns []any
		for _, a := range p.Nameservers {
			ns = append(ns, a.String())
		}
		eth["nameservers"] = map[string]any{"addresses": ns}
	}
	return map[string]any{"version": 2, "ethernets": map[string]any{"id0": eth}}
}
