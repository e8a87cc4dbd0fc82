package vmgroups

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	computev1alpha1 "github.com/quartermaster-dev/quartermaster/api/compute/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// addressBook orders the static address allocations of every group of the manager: one group at a
// time, each seeing every other group's, those this manager wrote and its cache has not seen yet
// included. The allocations themselves live in the groups' status (status.addresses), written
// before a VM is cloned with one.
type addressBook struct {
	mu     sync.Mutex
	claims map[types.NamespacedName]map[string]netip.Addr // written by this manager: group → VM → address
}

func (r *Reconciler) addressBook() *addressBook {
	r.addrOnce.Do(func() {
		if r.addrs == nil {
			r.addrs = &addressBook{claims: map[types.NamespacedName]map[string]netip.Addr{}}
		}
	})
	return r.addrs
}

// forget drops a deleted group's claims.
func (b *addressBook) forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.claims, key)
}

// pool parses the group's address pool (nil when it has none).
func addressPool(vg *computev1alpha1.VmGroup) (*vsphere.Pool, *failure) {
	ap := vg.Spec.AddressPool
	if ap == nil {
		return nil, nil
	}
	p, err := vsphere.ParsePool(ap.Network, ap.Addresses, ap.Gateway, ap.Nameservers)
	if err != nil {
		return nil, stalled("AddressPoolInvalid", "spec.addressPool: "+err.Error()+"; nothing is cloned until it is fixed")
	}
	return &p, nil
}

// allocations reads the group's recorded addresses.
func allocations(vg *computev1alpha1.VmGroup) map[string]netip.Addr {
	out := map[string]netip.Addr{}
	for _, a := range vg.Status.Addresses {
		if p, err := netip.ParsePrefix(a.Address); err == nil {
			out[a.VM] = p.Addr()
		}
	}
	return out
}

// allocate gives an address to every VM the plan clones (new ones and the one replaced) that has
// none, records them in the status and writes it (persist) before anything is cloned; it releases
// the addresses of VMs that are gone and not wanted. It returns the names it found no address for
// (taken out of the plan): the pool is exhausted, or its free addresses are used by VMs
// Quartermaster did not create (each found once with VMware Tools' report, skipped, said in an
// Event).
func (r *Reconciler) allocate(ctx context.Context, g *group, plan *vsphere.Plan, obs vsphere.Observation, running vsphere.InFlight, persist func() error) ([]string, *failure) {
	book := r.addressBook()
	book.mu.Lock()
	defer book.mu.Unlock()

	live := liveVMs(obs, running)
	own := allocations(g.vg)
	for name := range own {
		n, ok := vsphere.Ordinal(g.spec.Name, name)
		if wanted := live(name) || ok && n < g.spec.Replicas; !wanted {
			delete(own, name) // its VM is gone and its name no longer wanted: released
		}
	}
	var need []string
	for _, n := range plan.Create {
		need = append(need, vsphere.VMName(g.spec.Name, n))
	}
	if plan.Replace != nil {
		need = append(need, plan.Replace.Name)
	}
	for _, name := range need {
		if a, ok := own[name]; ok && !g.pool.Contains(a) {
			delete(own, name) // of a pool the spec changed: the new VM gets an address of the new one
		}
	}
	need = slices.DeleteFunc(need, func(name string) bool { _, ok := own[name]; return ok })

	var short []string
	if len(need) > 0 {
		taken, err := r.takenByOthers(ctx, g.key, book)
		if err != nil {
			return nil, &failure{Outcome: status.Transient("AddressesUnreadable", "reading the other groups' addresses: "+err.Error(), err)}
		}
		for _, a := range own {
			taken[a] = true
		}
		for _, name := range need {
			a, f := r.nextFree(ctx, g, taken)
			if f != nil {
				return nil, f
			}
			if !a.IsValid() {
				short = append(short, name)
				continue
			}
			own[name], taken[a] = a, true
		}
	}
	g.vg.Status.Addresses = nil
	for _, name := range slices.SortedFunc(maps.Keys(own), vsphere.CompareVMNames) {
		g.vg.Status.Addresses = append(g.vg.Status.Addresses, computev1alpha1.AddressAllocation{VM: name, Address: netip.PrefixFrom(own[name], g.pool.Network.Bits()).String()})
	}
	// Claimed before the write: a write that fails here but lands (a timeout) never lets another
	// group take these addresses; claiming too much is safe.
	book.claims[g.key] = own
	if len(need) > len(short) {
		// Recorded before any clone uses them: a manager stopped after this write and before the
		// clone gives the VM the same address next time; one stopped before it gave none.
		if err := persist(); err != nil {
			return nil, &failure{Outcome: status.Transient("StatusWriteFailed", "recording the VMs' addresses: "+err.Error(), err)}
		}
	}
	g.addresses = own
	if len(short) > 0 {
		drop := map[string]bool{}
		for _, name := range short {
			drop[name] = true
		}
		plan.Create = slices.DeleteFunc(plan.Create, func(n int) bool { return drop[vsphere.VMName(g.spec.Name, n)] })
		if plan.Replace != nil && drop[plan.Replace.Name] {
			plan.Replace = nil
		}
	}
	return short, nil
}

// liveVMs reports whether a name is a member of the group or has an operation in flight: a VM
// whose address is still its own.
func liveVMs(obs vsphere.Observation, running vsphere.InFlight) func(string) bool {
	members := map[string]bool{}
	for _, m := range obs.Members {
		members[m.Name] = true
	}
	return func(name string) bool { return members[name] || running.Cloning[name] || running.Busy[name] }
}

// keepAddresses keeps the recorded addresses of the VMs that exist or are in flight only, for a
// group whose pool was dropped.
func keepAddresses(vg *computev1alpha1.VmGroup, obs vsphere.Observation, running vsphere.InFlight) {
	live := liveVMs(obs, running)
	vg.Status.Addresses = slices.DeleteFunc(vg.Status.Addresses, func(a computev1alpha1.AddressAllocation) bool { return !live(a.VM) })
	if len(vg.Status.Addresses) == 0 {
		vg.Status.Addresses = nil
	}
}

// takenByOthers are the addresses other groups hold: their status as cached, or what this manager
// wrote for them when it has.
func (r *Reconciler) takenByOthers(ctx context.Context, self types.NamespacedName, book *addressBook) (map[netip.Addr]bool, error) {
	list := &computev1alpha1.VmGroupList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, err
	}
	taken := map[netip.Addr]bool{}
	for i := range list.Items {
		vg := &list.Items[i]
		key := types.NamespacedName{Namespace: vg.Namespace, Name: vg.Name}
		if key == self {
			continue
		}
		if _, ok := book.claims[key]; ok {
			continue
		}
		for _, a := range allocations(vg) {
			taken[a] = true
		}
	}
	for key, claims := range book.claims {
		if key != self {
			for _, a := range claims {
				taken[a] = true
			}
		}
	}
	return taken, nil
}

// nextFree is the pool's lowest address nobody holds and no VM's guest reports (one vCenter search
// per address looked at); the zero address when there is none.
func (r *Reconciler) nextFree(ctx context.Context, g *group, taken map[netip.Addr]bool) (netip.Addr, *failure) {
	for {
		a, ok := g.pool.Next(func(a netip.Addr) bool { return taken[a] })
		if !ok {
			return netip.Addr{}, nil
		}
		users, err := g.api.VMsWithIP(ctx, a.String())
		if err != nil {
			return netip.Addr{}, classify(err)
		}
		if len(users) == 0 {
			return a, nil
		}
		taken[a] = true
		r.Recorder.Eventf(g.vg, nil, corev1.EventTypeWarning, "AddressInUse", "Allocate",
			"%s of spec.addressPool is skipped: VMware Tools report it in use by %s, which this group did not get it for", a, strings.Join(users, ", "))
	}
}

// exhausted is the failure of a group the pool has no address left for.
func exhausted(g *group, names []string) *failure {
	return stalled("AddressPoolExhausted", fmt.Sprintf(
		"no address left in spec.addressPool for %s: its %d addresses are held by this group's VMs (%d), other groups' or VMs Quartermaster did not create (see the AddressInUse Events); add addresses or lower spec.replicas",
		strings.Join(names, ", "), g.pool.Size(), len(g.addresses)))
}
