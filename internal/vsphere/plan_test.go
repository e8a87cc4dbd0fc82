package vsphere

import (
	"fmt"
	"slices"
	"testing"
)

var spec = Spec{Name: "web", Key: "ns/web", Replicas: 3, CPU: 2, MemoryMB: 2048, Template: "tmpl"}

// vm is a member of spec's group, up to date and powered on unless changed by opts.
func vm(ordinal int, opts ...func(*VM)) VM {
	v := VM{ID: fmt.Sprintf("vm-%d", ordinal), Name: VMName(spec.Name, ordinal), PowerState: PoweredOn,
		CPU: spec.CPU, MemoryMB: spec.MemoryMB, Group: spec.Key, Template: spec.Template}
	for _, o := range opts {
		o(&v)
	}
	return v
}

func off(v *VM)         { v.PowerState = PoweredOff }
func oldCPU(v *VM)      { v.CPU = 1 }
func oldTemplate(v *VM) { v.Template = "old" }
func foreign(v *VM)     { v.Group = "" }

func ordinals(ms []Member) []int {
	out := []int{}
	for _, m := range ms {
		out = append(out, m.Ordinal)
	}
	return out
}

func TestNewPlan(t *testing.T) {
	cases := []struct {
		name        string
		replicas    int
		vms         []VM
		batch       int
		create      []int
		missing     int
		del         []int
		powerOn     []int
		replace     int // -1: none
		reconfigure int // -1: none
		unmanaged   int
		deleteFirst []string // names of members to remove first on scale-in
	}{
		{name: "empty group creates from 0", replicas: 3, batch: 4, create: []int{0, 1, 2}, missing: 3, replace: -1, reconfigure: -1},
		{name: "batch bounds the clones", replicas: 20, batch: 4, create: []int{0, 1, 2, 3}, missing: 20, replace: -1, reconfigure: -1},
		{name: "converged", replicas: 3, vms: []VM{vm(0), vm(1), vm(2)}, batch: 4, replace: -1, reconfigure: -1},
		{name: "scale up fills the gaps first", replicas: 4, vms: []VM{vm(0), vm(2)}, batch: 4, create: []int{1, 3}, missing: 2, replace: -1, reconfigure: -1},
		{name: "destroyed out of band is re-created", replicas: 3, vms: []VM{vm(0), vm(2)}, batch: 4, create: []int{1}, missing: 1, replace: -1, reconfigure: -1},
		{name: "scale down removes highest first", replicas: 2, vms: []VM{vm(3), vm(0), vm(1), vm(2)}, batch: 4, del: []int{3, 2}, replace: -1, reconfigure: -1},
		{name: "scale to zero", replicas: 0, vms: []VM{vm(0), vm(1)}, batch: 4, del: []int{1, 0}, replace: -1, reconfigure: -1},
		{name: "scale down keeps low gaps", replicas: 2, vms: []VM{vm(0), vm(2), vm(5)}, batch: 4, del: []int{5}, replace: -1, reconfigure: -1},
		{name: "powered off out of band is powered on", replicas: 3, vms: []VM{vm(0), vm(1, off), vm(2)}, batch: 4, powerOn: []int{1}, replace: -1, reconfigure: -1},
		{name: "a powered off VM being removed is not powered on", replicas: 2, vms: []VM{vm(0), vm(1), vm(2, off)}, batch: 4, del: []int{2}, replace: -1, reconfigure: -1},
		{name: "reconfigure one at a time, lowest first", replicas: 3, vms: []VM{vm(0), vm(1, oldCPU), vm(2, oldCPU)}, batch: 4, replace: -1, reconfigure: 1},
		{name: "replace before reconfigure", replicas: 3, vms: []VM{vm(0, oldCPU), vm(1), vm(2, oldTemplate)}, batch: 4, replace: 2, reconfigure: -1},
		{name: "no rolling while a VM is off", replicas: 3, vms: []VM{vm(0, oldCPU), vm(1, off), vm(2)}, batch: 4, powerOn: []int{1}, replace: -1, reconfigure: -1},
		{name: "no rolling while a VM is missing", replicas: 3, vms: []VM{vm(0, oldTemplate), vm(1)}, batch: 4, create: []int{2}, missing: 1, replace: -1, reconfigure: -1},
		{name: "no rolling while scaling down", replicas: 1, vms: []VM{vm(0, oldTemplate), vm(1)}, batch: 4, del: []int{1}, replace: -1, reconfigure: -1},
		{name: "hand-made VMs are left alone and their names not reused", replicas: 3,
			vms: []VM{vm(0), vm(1, foreign), {Name: "scratch", PowerState: PoweredOff}}, batch: 4,
			create: []int{2, 3}, missing: 2, replace: -1, reconfigure: -1, unmanaged: 2},
		{name: "another group's VM in the folder is not ours", replicas: 1,
			vms: []VM{vm(0, func(v *VM) { v.Group = "other/web" })}, batch: 1, create: []int{1}, missing: 1, replace: -1, reconfigure: -1, unmanaged: 1},
		{name: "no free clone slot starts no clone", replicas: 2, batch: 0, missing: 2, replace: -1, reconfigure: -1},
		{name: "scale down removes the named first", replicas: 2, vms: []VM{vm(0), vm(1), vm(2), vm(3)}, batch: 4,
			deleteFirst: []string{"web-1"}, del: []int{1, 3}, replace: -1, reconfigure: -1},
		{name: "the named go first, highest ordinal first", replicas: 2, vms: []VM{vm(0), vm(1), vm(2), vm(3)}, batch: 4,
			deleteFirst: []string{"web-0", "web-1", "web-2"}, del: []int{2, 1}, replace: -1, reconfigure: -1},
		{name: "names that are no members change nothing", replicas: 1, vms: []VM{vm(0), vm(1)}, batch: 4,
			deleteFirst: []string{"web-7", "scratch"}, del: []int{1}, replace: -1, reconfigure: -1},
		{name: "the named stay while nothing scales in", replicas: 3, vms: []VM{vm(0), vm(1), vm(2)}, batch: 4,
			deleteFirst: []string{"web-1"}, replace: -1, reconfigure: -1},
		{name: "the kept roll lowest ordinal first after a named removal", replicas: 2, vms: []VM{vm(0), vm(1), vm(2, oldCPU)}, batch: 4,
			deleteFirst: []string{"web-0"}, del: []int{0}, replace: -1, reconfigure: -1},
		{name: "a gap left by a named removal is filled on scale-up", replicas: 3, vms: []VM{vm(0), vm(2)}, batch: 4,
			deleteFirst: []string{"web-1"}, create: []int{1}, missing: 1, replace: -1, reconfigure: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := spec
			s.Replicas = c.replicas
			if len(c.deleteFirst) > 0 {
				s.DeleteFirst = map[string]bool{}
				for _, n := range c.deleteFirst {
					s.DeleteFirst[n] = true
				}
			}
			o := Observe(s, c.vms, nil)
			if len(o.Unmanaged) != c.unmanaged {
				t.Errorf("unmanaged = %v, want %d", o.Unmanaged, c.unmanaged)
			}
			p := NewPlan(s, o, InFlight{}, c.batch)
			if !slices.Equal(p.Create, c.create) {
				t.Errorf("create = %v, want %v", p.Create, c.create)
			}
			if p.Missing != c.missing {
				t.Errorf("missing = %d, want %d", p.Missing, c.missing)
			}
			if got := ordinals(p.Delete); !slices.Equal(got, orEmpty(c.del)) {
				t.Errorf("delete = %v, want %v", got, c.del)
			}
			if got := ordinals(p.PowerOn); !slices.Equal(got, orEmpty(c.powerOn)) {
				t.Errorf("power on = %v, want %v", got, c.powerOn)
			}
			if got := ordinalOf(p.Replace); got != c.replace {
				t.Errorf("replace = %d, want %d", got, c.replace)
			}
			if got := ordinalOf(p.Reconfigure); got != c.reconfigure {
				t.Errorf("reconfigure = %d, want %d", got, c.reconfigure)
			}
			sum := Summarize(s, o)
			converged := sum.Current == s.Replicas && sum.Ready == s.Replicas && sum.UpToDate == s.Replicas
			if p.Settled != converged || converged && !p.Empty() {
				t.Errorf("plan settled = %v, empty = %v, but summary %+v", p.Settled, p.Empty(), sum)
			}
		})
	}
}

// TestNewPlanInFlight: what runs in the background counts, and nothing runs twice.
func TestNewPlanInFlight(t *testing.T) {
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	s := spec
	s.Replicas = 6
	t.Run("clones in flight count and take slots", func(t *testing.T) {
		o := Observe(s, []VM{vm(0), vm(1)}, nil)
		p := NewPlan(s, o, InFlight{Cloning: set("web-2", "web-3")}, 1)
		if !slices.Equal(p.Create, []int{4}) || p.Missing != 2 || p.Settled {
			t.Errorf("plan = %+v, want web-4 created and 2 missing", p)
		}
	})
	t.Run("a half-made clone is neither a member nor unmanaged", func(t *testing.T) {
		o := Observe(s, []VM{vm(0), {Name: "web-1"}}, set("web-1"))
		if len(o.Members) != 1 || len(o.Unmanaged) != 0 {
			t.Errorf("observation = %+v", o)
		}
	})
	t.Run("scale down waits for clones beyond the spec and leaves busy VMs", func(t *testing.T) {
		s := s
		s.Replicas = 1
		o := Observe(s, []VM{vm(0), vm(1), vm(2)}, nil)
		p := NewPlan(s, o, InFlight{Cloning: set("web-3"), Busy: set("web-2")}, 4)
		if got := ordinals(p.Delete); !slices.Equal(got, []int{1}) || len(p.Create) > 0 {
			t.Errorf("delete = %v, create = %v; want web-1 deleted alone", got, p.Create)
		}
	})
	t.Run("no rolling while anything runs or a guest has no address", func(t *testing.T) {
		s := s
		s.Replicas, s.GuestIP = 2, true
		withIP := func(v *VM) { v.IP = "10.0.0.1" }
		o := Observe(s, []VM{vm(0, oldTemplate, withIP), vm(1)}, nil)
		p := NewPlan(s, o, InFlight{}, 4)
		if p.Replace != nil || len(p.Waiting) != 1 || p.Waiting[0].Ordinal != 1 {
			t.Errorf("plan = %+v, want web-1 waiting for its address and no replacement", p)
		}
		o = Observe(s, []VM{vm(0, oldTemplate, withIP), vm(1, withIP)}, nil)
		if p := NewPlan(s, o, InFlight{Busy: set("web-1")}, 4); p.Replace != nil {
			t.Errorf("replacing while web-1 is busy")
		}
		if p := NewPlan(s, o, InFlight{}, 4); ordinalOf(p.Replace) != 0 {
			t.Errorf("replace = %v, want web-0", ordinalOf(p.Replace))
		}
	})
}

func TestCompareVMNames(t *testing.T) {
	names := []string{"web-10", "web-2", "scratch", "web-1"}
	slices.SortFunc(names, CompareVMNames)
	if want := []string{"web-1", "web-2", "web-10", "scratch"}; !slices.Equal(names, want) {
		t.Errorf("sorted = %v, want %v", names, want)
	}
}

func orEmpty(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func ordinalOf(m *Member) int {
	if m == nil {
		return -1
	}
	return m.Ordinal
}

func TestSummarize(t *testing.T) {
	o := Observe(spec, []VM{vm(0), vm(1, off), vm(2, oldCPU), {Name: "x"}}, nil)
	got := Summarize(spec, o)
	if got != (Summary{Current: 3, Ready: 2, UpToDate: 2}) {
		t.Errorf("Summarize = %+v", got)
	}
}

// FuzzNewPlan checks the plan's invariants on arbitrary folders: it never touches what is not the
// group's, never reuses a name, never overshoots, and rolls only a complete, available group.
func FuzzNewPlan(f *testing.F) {
	f.Add(uint8(3), uint8(4), []byte{0, 1, 2})
	f.Add(uint8(1), uint8(2), []byte{0x13, 0x22, 0x41, 0x80, 0x05})
	f.Add(uint8(0), uint8(1), []byte{7, 7, 3})
	f.Fuzz(func(t *testing.T, replicas, batch uint8, data []byte) {
		s := spec
		s.Replicas = int(replicas % 32)
		var vms []VM
		for _, b := range data {
			ordinal := int(b & 0x0f)
			v := vm(ordinal)
			if b&0x10 != 0 {
				v.PowerState = PoweredOff
			}
			if b&0x20 != 0 {
				v.CPU = 1
			}
			if b&0x40 != 0 {
				v.Template = "old"
			}
			if b&0x80 != 0 {
				v.Group = ""
			}
			vms = append(vms, v)
		}
		o := Observe(s, vms, nil)
		p := NewPlan(s, o, InFlight{}, int(batch%8))

		names := map[string]bool{}
		for _, v := range vms {
			names[v.Name] = true
		}
		for _, n := range p.Create {
			if names[VMName(s.Name, n)] {
				t.Fatalf("plan creates %s, which exists", VMName(s.Name, n))
			}
		}
		if len(p.Create) > int(batch%8) {
			t.Fatalf("plan creates %d VMs in one batch of %d", len(p.Create), batch%8)
		}
		if len(o.Members)-len(p.Delete)+p.Missing != s.Replicas {
			t.Fatalf("members %d - delete %d + missing %d != replicas %d", len(o.Members), len(p.Delete), p.Missing, s.Replicas)
		}
		touched := append(append([]Member{}, p.Delete...), p.PowerOn...)
		if p.Replace != nil {
			touched = append(touched, *p.Replace)
		}
		if p.Reconfigure != nil {
			touched = append(touched, *p.Reconfigure)
		}
		for _, m := range touched {
			if m.Group != s.Key {
				t.Fatalf("plan touches %s, which is not the group's", m.Name)
			}
		}
		if p.Replace != nil || p.Reconfigure != nil {
			if p.Replace != nil && p.Reconfigure != nil {
				t.Fatal("two rolling steps at once")
			}
			if len(p.Delete)+len(p.Create)+len(p.PowerOn) > 0 {
				t.Fatal("rolling while the group is incomplete or unavailable")
			}
			for _, m := range o.Members {
				if !m.Available() {
					t.Fatalf("rolling while %s is unavailable", m.Name)
				}
			}
		}
	})
}

// TestNeedsReplaceSnapshot: a linked group naming a snapshot replaces the linked members made from
// another one; full clones and groups on the template's current snapshot keep their members.
func TestNeedsReplaceSnapshot(t *testing.T) {
	base := Spec{Template: "t", Linked: true, Snapshot: "v2"}
	for _, c := range []struct {
		spec     Spec
		snapshot string
		want     bool
	}{
		{base, "v1", true},
		{base, "v2", false},
		{base, "", false}, // a full clone: a change of clone mode applies to new clones
		{Spec{Template: "t", Linked: true}, "v1", false},
		{Spec{Template: "t", Snapshot: "v2"}, "v1", false},
	} {
		m := Member{VM: VM{Template: "t", Snapshot: c.snapshot}}
		if got := m.NeedsReplace(c.spec); got != c.want {
			t.Errorf("spec %+v, member of snapshot %q: NeedsReplace %v, want %v", c.spec, c.snapshot, got, c.want)
		}
	}
}
