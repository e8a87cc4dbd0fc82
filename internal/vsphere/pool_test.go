package vsphere

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParsePool(t *testing.T) {
	for _, c := range []struct {
		network, gateway string
		addresses        []string
		size             int64
		first            string
		err              string
	}{
		{network: "10.20.0.0/24", size: 254, first: "10.20.0.1"},
		{network: "10.20.0.7/24", gateway: "10.20.0.1", size: 253, first: "10.20.0.2"}, // host bits masked
		{network: "10.20.0.0/24", addresses: []string{"10.20.0.20-10.20.0.29", "10.20.0.25-10.20.0.34", "10.20.0.5"}, size: 16, first: "10.20.0.5"},
		{network: "10.20.0.0/24", gateway: "10.20.0.21", addresses: []string{"10.20.0.20-10.20.0.22"}, size: 2, first: "10.20.0.20"},
		{network: "10.0.0.0/8", size: 1<<24 - 2, first: "10.0.0.1"},
		{network: "10.20.0.0/31", err: "prefix must be /30 or shorter"},
		{network: "fd00::/64", err: "not an IPv4 CIDR"},
		{network: "10.20.0.0/24", addresses: []string{"10.21.0.5"}, err: `"10.21.0.5" is not within network 10.20.0.0/24`},
		{network: "10.20.0.0/24", addresses: []string{"10.20.0.9-10.20.0.5"}, err: "two IPv4 addresses in order"},
		{network: "10.20.0.0/24", addresses: []string{"10.20.0.250-10.20.0.255"}, err: "broadcast"},
		{network: "10.20.0.0/24", gateway: "10.30.0.1", err: "gateway \"10.30.0.1\" is not an address of network"},
	} {
		p, err := ParsePool(c.network, c.addresses, c.gateway, nil)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want %q", c, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if p.Size() != c.size {
			t.Errorf("%+v: size %d, want %d", c, p.Size(), c.size)
		}
		if a, ok := p.Next(func(netip.Addr) bool { return false }); !ok || a.String() != c.first {
			t.Errorf("%+v: first %s, want %s", c, a, c.first)
		}
	}
}

func TestPoolNextSkipsTakenAndGateway(t *testing.T) {
	p, err := ParsePool("10.20.0.0/24", []string{"10.20.0.10-10.20.0.12", "10.20.0.20"}, "10.20.0.11", []string{"10.20.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	taken := map[netip.Addr]bool{}
	var got []string
	for {
		a, ok := p.Next(func(a netip.Addr) bool { return taken[a] })
		if !ok {
			break
		}
		taken[a] = true
		got = append(got, a.String())
	}
	if strings.Join(got, ",") != "10.20.0.10,10.20.0.12,10.20.0.20" {
		t.Errorf("handed out %v", got)
	}
	if p.Contains(netip.MustParseAddr("10.20.0.11")) || !p.Contains(netip.MustParseAddr("10.20.0.12")) {
		t.Error("Contains: the gateway is never in the pool")
	}
	cfg := p.NetworkConfig("00:50:56:AA:BB:CC", netip.MustParseAddr("10.20.0.10"))
	eth := cfg["ethernets"].(map[string]any)["id0"].(map[string]any)
	if eth["match"].(map[string]any)["macaddress"] != "00:50:56:aa:bb:cc" || eth["addresses"].([]any)[0] != "10.20.0.10/24" {
		t.Errorf("network config %v", cfg)
	}
}
