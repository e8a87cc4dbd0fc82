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
	ID         string // vCenter's managed object id, e.g. vm-42
	Name       string
	PowerState PowerState
	IP         string
	CPU        int32
	MemoryMB   int32
	Group      string // the KeyGroup extraConfig value; "" on VMs the operator did not clone
	Template   string // the KeyTemplate extraConfig value
}

// Spec is what a group asks for, in vCenter's units.
type Spec struct {
	Name     string // the VmGroup's name, prefix of its VM names
	Key      string // GroupKey of the VmGroup
	Replicas int
	CPU      int32
	MemoryMB int32
	Template string
}

// Member is one of the group's VMs with its ordinal.
type Member struct {
	VM
	Ordinal int
}

// Available reports whether the VM serves: it is powered on.
func (m Member) Available() bool { return m.PowerState == PoweredOn }

// NeedsReplace reports whether the VM was cloned from another template than the spec's.
func (m Member) NeedsReplace(s Spec) bool { return m.Template != s.Template }

// NeedsReconfigure reports whether the VM's CPU or memory differ from the spec's.
func (m Member) NeedsReconfigure(s Spec) bool { return m.CPU != s.CPU || m.MemoryMB != s.MemoryMB }

// UpToDate reports whether the VM matches the spec.
func (m Member) UpToDate(s Spec) bool { return !m.NeedsReplace(s) && !m.NeedsReconfigure(s) }

// Observation sorts a folder's VMs into the group's members and the rest.
type Observation struct {
	Members   []Member // by ordinal
	Unmanaged []VM     // by name: VMs the operator did not clone for this group; never touched
}

// Observe sorts the VMs of a group's folder. A VM is a member when it carries the group's mark and
// its name is <name>-<ordinal>; anything else was put there by someone else.
func Observe(s Spec, vms []VM) Observation {
	var o Observation
	for _, vm := range vms {
		if n, ok := Ordinal(s.Name, vm.Name); ok && vm.Group == s.Key {
			o.Members = append(o.Members, Member{VM: vm, Ordinal: n})
		} else {
			o.Unmanaged = append(o.Unmanaged, vm)
		}
	}
	slices.SortStableFunc(o.Members, func(a, b Member) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	slices.SortStableFunc(o.Unmanaged, func(a, b VM) int { return cmp.Compare(a.Name, b.Name) })
	return o
}

// Plan is the next bounded step towards the spec. Steps that reduce availability are taken one VM
// at a time and only when every other VM is available, so at most one VM is ever unavailable
// because of the operator.
type Plan struct {
	// Delete are members beyond spec.Replicas, highest ordinal first.
	Delete []Member
	// Create are the ordinals to clone now, lowest first: at most the batch size of the Missing.
	Create []int
	// Missing is how many VMs are missing in all.
	Missing int
	// PowerOn are kept members found powered off or suspended (drift).
	PowerOn []Member
	// Replace is the one member to destroy and clone again from the spec's template.
	Replace *Member
	// Reconfigure is the one member to power off, give the spec's CPU and memory, and power on.
	Reconfigure *Member
}

// Empty reports whether the group already matches the spec.
func (p Plan) Empty() bool {
	return len(p.Delete) == 0 && len(p.Create) == 0 && p.Missing == 0 && len(p.PowerOn) == 0 &&
		p.Replace == nil && p.Reconfigure == nil
}

// NewPlan computes the next step. batch bounds the clones of one step, so a newer spec is read
// between batches (5 → 20 → 3 does not first create 15 VMs).
func NewPlan(s Spec, o Observation, batch int) Plan {
	batch = max(batch, 1)
	replicas := max(s.Replicas, 0)
	var p Plan
	keep := o.Members
	if len(keep) > replicas {
		for i := len(keep) - 1; i >= replicas; i-- {
			p.Delete = append(p.Delete, keep[i])
		}
		keep = keep[:replicas]
	}

	// An ordinal is never reused while a VM of that name exists, ours or not.
	used := map[int]bool{}
	for _, m := range o.Members {
		used[m.Ordinal] = true
	}
	for _, vm := range o.Unmanaged {
		if n, ok := Ordinal(s.Name, vm.Name); ok {
			used[n] = true
		}
	}
	p.Missing = replicas - len(keep)
	for n := 0; len(p.Create) < min(p.Missing, batch); n++ {
		if !used[n] {
			p.Create = append(p.Create, n)
		}
	}

	for _, m := range keep {
		if !m.Available() {
			p.PowerOn = append(p.PowerOn, m)
		}
	}
	if len(p.Delete) > 0 || p.Missing > 0 || len(p.PowerOn) > 0 {
		return p // roll only a complete, fully available group
	}
	for i := range keep {
		if keep[i].NeedsReplace(s) {
			p.Replace = &keep[i]
			return p
		}
	}
	for i := range keep {
		if keep[i].NeedsReconfigure(s) {
			p.Reconfigure = &keep[i]
			return p
		}
	}
	return p
}

// Summary counts a group's members.
type Summary struct {
	Current  int // members that exist
	Ready    int // members powered on
	UpToDate int // members matching the spec
}

// Summarize counts the members of an observation.
func Summarize(s Spec, o Observation) Summary {
	sum := Summary{Current: len(o.Members)}
	for _, m := range o.Members {
		if m.Available() {
			sum.Ready++
		}
		if m.UpToDate(s) {
			sum.UpToDate++
		}
	}
	return sum
}
