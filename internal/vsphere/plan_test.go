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
		{name: "zero batch still progresses", replicas: 2, batch: 0, create: []int{0}, missing: 2, replace: -1, reconfigure: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := spec
			s.Replicas = c.replicas
			o := Observe(s, c.vms)
			if len(o.Unmanaged) != c.unmanaged {
				t.Errorf("unmanaged = %v, want %d", o.Unmanaged, c.unmanaged)
			}
			p := NewPlan(s, o, c.batch)
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
			if p.Empty() != converged {
				t.Errorf("plan empty = %v but summary %+v", p.Empty(), sum)
			}
		})
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
	o := Observe(spec, []VM{vm(0), vm(1, off), vm(2, oldCPU), {Name: "x"}})
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
		o := Observe(s, vms)
		p := NewPlan(s, o, int(batch%8))

		names := map[string]bool{}
		for _, v := range vms {
			names[v.Name] = true
		}
		for _, n := range p.Create {
			if names[VMName(s.Name, n)] {
				t.Fatalf("plan creates %s, which exists", VMName(s.Name, n))
			}
		}
		if len(p.Create) > max(int(batch%8), 1) {
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
