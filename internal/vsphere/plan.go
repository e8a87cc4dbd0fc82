package vsphere

import (
	"cmp"
	"slices"
)

// PowerState is a VM's power state as vCenter reports it.
type PowerState string

// Power states.
const (
	PoweredOn  PowerState = "poweredOn"
	PoweredOff PowerState = "poweredOff"
	Suspended  PowerState = "suspended"
)

// VM is one VM found in a group's folder.
type VM struct {
	ID           string // vCenter's managed object id, e.g. vm-42
	Name         string
	PowerState   PowerState
	IP           string   // the guest's primary address, as VMware Tools report it
	IPs          []string // every address of the guest's network adapters
	ToolsRunning bool     // VMware Tools run in the guest: it can be asked to shut down
	CPU          int32
	MemoryMB     int32
	Group        string // the KeyGroup extraConfig value; "" on VMs the operator did not clone
	Template     string // the KeyTemplate extraConfig value
	Boot         string // the KeyBoot extraConfig value: fingerprint of the first-boot data
	Disks        []Disk // the KeyDisks extraConfig value: the data disks it was cloned with, as grown since
	Snapshot     string // the KeySnapshot extraConfig value: the snapshot a linked clone was made from ("" for a full clone)
	Address      string // the KeyAddress extraConfig value: the static address its network configuration gives it
}

// Spec is what a group asks for, in vCenter's units.
type Spec struct {
	Name     string // the VmGroup's name, prefix of its VM names
	Key      string // GroupKey of the VmGroup
	Replicas int
	CPU      int32
	MemoryMB int32
	Template string
	// Linked: members are linked clones of the template's snapshot (Snapshot; "": its current
	// one), not full copies. A member's clone mode is not checked: a change applies to new clones;
	// but a linked group naming a snapshot replaces the linked members made from another one.
	Linked   bool
	Snapshot string
	// Boot is the fingerprint of the first-boot data (cloud-init user data and metadata); "" for none.
	Boot string
	// Disks are the data disks each VM has beside the template's: a change of their names or
	// datastores replaces the VMs, a larger size grows them in place.
	Disks []Disk
	// GuestIP: a VM is ready only once its guest reports an IP address, not as soon as it is on.
	GuestIP bool
	// DeleteFirst names members to remove first when the group scales in (the VmGroup's
	// compute.quartermaster.dev/delete-first annotation); the others go highest ordinal first.
	DeleteFirst map[string]bool
}

// Member is one of the group's VMs with its ordinal.
type Member struct {
	VM
	Ordinal int
}

// Available reports whether the VM is powered on.
func (m Member) Available() bool { return m.PowerState == PoweredOn }

// Ready reports whether the VM serves: powered on and, when the spec asks, with a guest IP.
func (m Member) Ready(s Spec) bool { return m.Available() && (!s.GuestIP || m.IP != "") }

// NeedsReplace reports whether the VM was cloned from another template, with other first-boot
// data or other data disks (names, datastores) than the spec's: the guest reads the first two once,
// and a disk the spec no longer has is not taken from a running VM, so only a new VM takes a change.
func (m Member) NeedsReplace(s Spec) bool {
	return m.Template != s.Template || m.Boot != s.Boot || layout(m.Disks) != layout(s.Disks) ||
		s.Linked && s.Snapshot != "" && m.Snapshot != "" && m.Snapshot != s.Snapshot
}

// NeedsReconfigure reports whether the VM's CPU or memory differ from the spec's, or a data disk
// of it is smaller.
func (m Member) NeedsReconfigure(s Spec) bool {
	return m.CPU != s.CPU || m.MemoryMB != s.MemoryMB || m.Grown(s) != nil
}

// UpToDate reports whether the VM matches the spec.
func (m Member) UpToDate(s Spec) bool { return !m.NeedsReplace(s) && !m.NeedsReconfigure(s) }

// Observation sorts a folder's VMs into the group's members and the rest.
type Observation struct {
	Members   []Member // by ordinal
	Unmanaged []VM     // by name: VMs the operator did not clone for this group; never touched
}

// Observe sorts the VMs of a group's folder. A VM is a member when it carries the group's mark and
// its name is <name>-<ordinal>; anything else was put there by someone else, except a VM of a
// name being cloned right now (cloning), which vCenter may show before its clone has finished.
func Observe(s Spec, vms []VM, cloning map[string]bool) Observation {
	var o Observation
	for _, vm := range vms {
		n, ok := Ordinal(s.Name, vm.Name)
		switch {
		case ok && vm.Group == s.Key:
			o.Members = append(o.Members, Member{VM: vm, Ordinal: n})
		case !cloning[vm.Name]:
			o.Unmanaged = append(o.Unmanaged, vm)
		}
	}
	slices.SortStableFunc(o.Members, func(a, b Member) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	slices.SortStableFunc(o.Unmanaged, func(a, b VM) int { return cmp.Compare(a.Name, b.Name) })
	return o
}

// InFlight is what runs for a group in the background while a plan is made.
type InFlight struct {
	Cloning map[string]bool // names of VMs being cloned
	Busy    map[string]bool // members under another operation: removal, power-on, replacement, reconfiguration
}

// Empty reports whether nothing runs.
func (f InFlight) Empty() bool { return len(f.Cloning) == 0 && len(f.Busy) == 0 }

// busy reports whether something runs on the VM: vCenter may show a clone before it has finished
// (powered off, say), which must not be acted on.
func (f InFlight) busy(name string) bool { return f.Busy[name] || f.Cloning[name] }

// Plan is what to start now towards the spec. Steps that reduce availability are taken one VM at a
// time and only when every other VM is ready and nothing else runs, so at most one VM is ever
// unavailable because of the operator.
type Plan struct {
	// Delete are members beyond spec.Replicas: those named in spec.DeleteFirst (highest ordinal
	// first) before the others, which go highest ordinal first.
	Delete []Member
	// Create are the ordinals to clone now, lowest first: as many of the Missing as there are free
	// clone slots.
	Create []int
	// Missing is how many VMs neither exist nor are being cloned.
	Missing int
	// PowerOn are kept members found powered off or suspended (drift).
	PowerOn []Member
	// Replace is the one member to destroy and clone again from the spec's template and first-boot data.
	Replace *Member
	// Reconfigure is the one member to power off, give the spec's CPU and memory, and power on.
	Reconfigure *Member
	// Waiting are kept members powered on whose guest has not reported an IP address yet.
	Waiting []Member
	// Settled: the group matches the spec, every VM is ready and nothing runs.
	Settled bool
}

// Empty reports whether there is nothing to start.
func (p Plan) Empty() bool {
	return len(p.Delete) == 0 && len(p.Create) == 0 && len(p.PowerOn) == 0 && p.Replace == nil && p.Reconfigure == nil
}

// NewPlan computes what to start now, given what already runs. cloneSlots bounds the clones it
// starts: the group's share of the clone concurrency not taken by its clones in flight, so a newer
// spec is read each time a clone ends (5 → 20 → 3 does not first create 15 VMs).
func NewPlan(s Spec, o Observation, running InFlight, cloneSlots int) Plan {
	replicas := max(s.Replicas, 0)
	var p Plan

	// The members and the VMs being cloned, by ordinal: the lowest replicas of them are kept.
	type slot struct {
		ordinal int
		member  *Member // nil: being cloned
	}
	var have []slot
	used := map[int]bool{} // an ordinal is never reused while a VM of that name exists, ours or not
	for i := range o.Members {
		have = append(have, slot{o.Members[i].Ordinal, &o.Members[i]})
		used[o.Members[i].Ordinal] = true
	}
	for name := range running.Cloning {
		if n, ok := Ordinal(s.Name, name); ok && !used[n] {
			have = append(have, slot{ordinal: n})
			used[n] = true
		}
	}
	for _, vm := range o.Unmanaged {
		if n, ok := Ordinal(s.Name, vm.Name); ok {
			used[n] = true
		}
	}
	// The members named to go first are last in line to be kept; then the lowest ordinals are.
	named := func(sl slot) bool { return sl.member != nil && s.DeleteFirst[sl.member.Name] }
	slices.SortFunc(have, func(a, b slot) int {
		if na, nb := named(a), named(b); na != nb {
			if na {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.ordinal, b.ordinal)
	})
	keep := have
	if len(have) > replicas {
		keep = slices.Clone(have[:replicas])
		for i := len(have) - 1; i >= replicas; i-- {
			// A clone beyond the spec is removed once it exists: cancelling it half-way could
			// leave a VM behind that nobody knows of.
			if m := have[i].member; m != nil && !running.busy(m.Name) {
				p.Delete = append(p.Delete, *m)
			}
		}
		slices.SortFunc(keep, func(a, b slot) int { return cmp.Compare(a.ordinal, b.ordinal) })
	}

	p.Missing = replicas - len(keep)
	for n := 0; len(p.Create) < min(p.Missing, max(cloneSlots, 0)); n++ {
		if !used[n] {
			p.Create = append(p.Create, n)
		}
	}

	allReady := true
	for _, k := range keep {
		m := k.member
		switch {
		case m == nil:
			allReady = false
		case running.busy(m.Name):
			allReady = false
		case !m.Available():
			p.PowerOn = append(p.PowerOn, *m)
			allReady = false
		case !m.Ready(s):
			p.Waiting = append(p.Waiting, *m)
			allReady = false
		}
	}
	if len(have) > replicas || p.Missing > 0 || !allReady || !running.Empty() {
		return p // roll only a complete, fully ready group with nothing in flight
	}
	for _, k := range keep {
		if k.member.NeedsReplace(s) {
			p.Replace = k.member
			return p
		}
	}
	for _, k := range keep {
		if k.member.NeedsReconfigure(s) {
			p.Reconfigure = k.member
			return p
		}
	}
	p.Settled = true
	return p
}

// Summary counts a group's members.
type Summary struct {
	Current  int // members that exist
	Ready    int // members ready
	UpToDate int // members matching the spec
}

// Summarize counts the members of an observation.
func Summarize(s Spec, o Observation) Summary {
	sum := Summary{Current: len(o.Members)}
	for _, m := range o.Members {
		if m.Ready(s) {
			sum.Ready++
		}
		if m.UpToDate(s) {
			sum.UpToDate++
		}
	}
	return sum
}
