package vsimtest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// Guests plays the guests' VMware Tools, which vcsim's VMs lack: when a VM powers on, its tools
// start and report an IP address; when it powers off, they stop. It works through vCenter's API
// (vcsim's SET.guest.* extraConfig), so watchers see the changes as on a real vCenter.
type Guests struct {
	sim *Sim

	mu      sync.Mutex
	paused  bool
	pending map[types.ManagedObjectReference]bool // powered on while paused
	noTools map[string]bool                       // VM names whose guests have no tools
	vms     map[types.ManagedObjectReference]*guest
	next    int

	stop context.CancelFunc
	done chan struct{}
}

// guest is what the tools know of a VM.
type guest struct {
	name string
	ip   string
}

// StartGuests runs the guests' tools until ctx ends or Stop. They look at the VMs every 20 ms:
// vcsim deadlocks when a property collector waits on a container view while VMs are created, so
// the tools poll rather than wait for updates.
func (s *Sim) StartGuests(ctx context.Context) (*Guests, error) {
	ctx, cancel := context.WithCancel(ctx)
	g := &Guests{sim: s, pending: map[types.ManagedObjectReference]bool{}, noTools: map[string]bool{},
		vms: map[types.ManagedObjectReference]*guest{}, stop: cancel, done: make(chan struct{})}
	if err := g.look(ctx); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(g.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = g.look(ctx) // a VM gone half-way is seen right at the next look
			}
		}
	}()
	return g, nil
}

// allVMs selects every VM of the inventory: folders, datacenters' VM folders, their VMs.
var allVMs = []types.BaseSelectionSpec{
	&types.TraversalSpec{SelectionSpec: types.SelectionSpec{Name: "folders"}, Type: "Folder", Path: "childEntity",
		SelectSet: []types.BaseSelectionSpec{&types.SelectionSpec{Name: "folders"}, &types.SelectionSpec{Name: "datacenters"}}},
	&types.TraversalSpec{SelectionSpec: types.SelectionSpec{Name: "datacenters"}, Type: "Datacenter", Path: "vmFolder",
		SelectSet: []types.BaseSelectionSpec{&types.SelectionSpec{Name: "folders"}}},
}

// look starts the tools of VMs powered on and stops those of VMs powered off.
func (g *Guests) look(ctx context.Context) error {
	c := g.sim.Admin.Client
	req := types.RetrievePropertiesEx{
		This: c.ServiceContent.PropertyCollector,
		SpecSet: []types.PropertyFilterSpec{{
			ObjectSet: []types.ObjectSpec{{Obj: c.ServiceContent.RootFolder, SelectSet: allVMs}},
			PropSet:   []types.PropertySpec{{Type: "VirtualMachine", PathSet: []string{"name", "runtime.powerState", "guest.ipAddress"}}},
		}},
	}
	objects, err := mo.RetrievePropertiesEx(ctx, c, req)
	if err != nil {
		return err
	}
	for _, o := range objects {
		u := types.ObjectUpdate{Obj: o.Obj, Kind: types.ObjectUpdateKindModify}
		for _, p := range o.PropSet {
			u.ChangeSet = append(u.ChangeSet, types.PropertyChange{Name: p.Name, Val: p.Val})
		}
		g.observe(ctx, u)
	}
	return nil
}

// Stop ends the tools and waits until they have let go of the simulator (vcsim waits for updates
// until told to stop, which the watch does as it ends).
func (g *Guests) Stop() {
	g.stop()
	<-g.done
}

// Pause keeps the tools of VMs powering on from starting until Resume.
func (g *Guests) Pause() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.paused = true
}

// Resume starts the tools of the VMs powered on meanwhile.
func (g *Guests) Resume(ctx context.Context) {
	g.mu.Lock()
	g.paused = false
	pending := g.pending
	g.pending = map[types.ManagedObjectReference]bool{}
	g.mu.Unlock()
	for ref := range pending {
		g.mu.Lock()
		noTools := g.vms[ref] != nil && g.noTools[g.vms[ref].name]
		g.mu.Unlock()
		if !noTools {
			g.boot(ctx, ref)
		}
	}
}

// NoTools makes the guest of the named VM one without VMware Tools (from its next power-on).
func (g *Guests) NoTools(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.noTools[name] = true
}

// observe follows a VM's power state, one update at a time and in order, so a quick power cycle
// ends with the tools running.
func (g *Guests) observe(ctx context.Context, u types.ObjectUpdate) {
	g.mu.Lock()
	if u.Kind == types.ObjectUpdateKindLeave {
		delete(g.vms, u.Obj)
		delete(g.pending, u.Obj)
		g.mu.Unlock()
		return
	}
	vm := g.vms[u.Obj]
	if vm == nil {
		vm = &guest{}
		g.vms[u.Obj] = vm
	}
	var state types.VirtualMachinePowerState
	for _, c := range u.ChangeSet {
		switch c.Name {
		case "name":
			vm.name, _ = c.Val.(string)
		case "runtime.powerState":
			state, _ = c.Val.(types.VirtualMachinePowerState)
		case "guest.ipAddress":
			vm.ip, _ = c.Val.(string)
		}
	}
	boot, reset := false, false
	switch {
	case state == types.VirtualMachinePowerStatePoweredOn && g.paused:
		g.pending[u.Obj] = true
	case state == types.VirtualMachinePowerStatePoweredOn:
		boot = !g.noTools[vm.name] && vm.ip == ""
	case state == types.VirtualMachinePowerStatePoweredOff:
		delete(g.pending, u.Obj)
		reset = vm.ip != ""
	}
	g.mu.Unlock()
	switch {
	case boot:
		g.boot(ctx, u.Obj)
	case reset:
		g.set(ctx, u.Obj, "", types.VirtualMachineToolsRunningStatusGuestToolsNotRunning)
	}
}

// boot starts a guest's tools: they report an address, the static one its cloud-init network
// configuration gives its first adapter when it has one, else one from DHCP.
func (g *Guests) boot(ctx context.Context, ref types.ManagedObjectReference) {
	ip := g.staticAddress(ctx, ref)
	if ip == "" {
		g.mu.Lock()
		g.next++
		ip = fmt.Sprintf("10.%d.%d.%d", 64+g.next/65536%64, g.next/256%256, g.next%256)
		g.mu.Unlock()
	}
	g.set(ctx, ref, ip, types.VirtualMachineToolsRunningStatusGuestToolsRunning)
}

// staticAddress plays cloud-init's VMware datasource: the address that the network configuration
// (netplan version 2) in guestinfo.metadata gives the adapter matching the VM's first adapter's MAC
// address; "" when there is none.
func (g *Guests) staticAddress(ctx context.Context, ref types.ManagedObjectReference) string {
	var vm mo.VirtualMachine
	if err := g.sim.Admin.RetrieveOne(ctx, ref, []string{"config.extraConfig", "config.hardware.device"}, &vm); err != nil || vm.Config == nil {
		return ""
	}
	var raw string
	for _, o := range vm.Config.ExtraConfig {
		if ov := o.GetOptionValue(); ov.Key == "guestinfo.metadata" {
			raw, _ = ov.Value.(string)
		}
	}
	js, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return ""
	}
	var md struct {
		Network struct {
			Ethernets map[string]struct {
				Match struct {
					MACAddress string `json:"macaddress"`
				} `json:"match"`
				Addresses []string `json:"addresses"`
			} `json:"ethernets"`
		} `json:"network"`
	}
	if json.Unmarshal(js, &md) != nil {
		return ""
	}
	mac := ""
	for _, d := range object.VirtualDeviceList(vm.Config.Hardware.Device).SelectByType((*types.VirtualEthernetCard)(nil)) {
		mac = d.(types.BaseVirtualEthernetCard).GetVirtualEthernetCard().MacAddress
		break
	}
	for _, eth := range md.Network.Ethernets {
		if mac != "" && strings.EqualFold(eth.Match.MACAddress, mac) && len(eth.Addresses) > 0 {
			if p, err := netip.ParsePrefix(eth.Addresses[0]); err == nil {
				return p.Addr().String()
			}
		}
	}
	return ""
}

func (g *Guests) set(ctx context.Context, ref types.ManagedObjectReference, ip string, tools types.VirtualMachineToolsRunningStatus) {
	spec := types.VirtualMachineConfigSpec{ExtraConfig: []types.BaseOptionValue{
		&types.OptionValue{Key: "SET.guest.ipAddress", Value: ip},
		&types.OptionValue{Key: "SET.guest.toolsRunningStatus", Value: string(tools)},
	}}
	g.mu.Lock()
	if vm := g.vms[ref]; vm != nil {
		vm.ip = ip
	}
	g.mu.Unlock()
	task, err := object.NewVirtualMachine(g.sim.Admin.Client, ref).Reconfigure(ctx, spec)
	if err == nil {
		_ = task.Wait(ctx) // a VM destroyed meanwhile needs no tools
	}
}

// Report makes the tools of a running VM's guest report the address ip (a guest configured by
// hand, say).
func (g *Guests) Report(t testing.TB, vmPath, ip string) {
	t.Helper()
	vm, err := g.sim.finder().VirtualMachine(context.Background(), vmPath)
	must(t, err)
	g.set(context.Background(), vm.Reference(), ip, types.VirtualMachineToolsRunningStatusGuestToolsRunning)
}

// StopTools stops the VMware Tools of a running VM's guest (as if uninstalled): it reports no
// address and cannot be asked to shut down, until the VM powers on again.
func (g *Guests) StopTools(t testing.TB, vmPath string) {
	t.Helper()
	vm, err := g.sim.finder().VirtualMachine(context.Background(), vmPath)
	must(t, err)
	g.mu.Lock()
	if v := g.vms[vm.Reference()]; v != nil {
		g.noTools[v.name] = true
	}
	g.mu.Unlock()
	g.set(context.Background(), vm.Reference(), "", types.VirtualMachineToolsRunningStatusGuestToolsNotRunning)
}
