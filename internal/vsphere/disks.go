package vsphere

import (
	"encoding/json"
	"slices"
	"strings"
)

// KeyDisks is the extraConfig entry recording a member's data disks (JSON, DisksMark): their
// names, sizes and datastores, and where each sits on the VM, so a size change finds its device.
const KeyDisks = "quartermaster.disks"

// Disk is a data disk of the group's VMs, beside the template's own.
type Disk struct {
	Name      string `json:"n"`
	SizeGiB   int32  `json:"g"`
	Datastore string `json:"d,omitempty"` // "" the VM's
	// Controller and Unit place the disk on its VM: the device key of its controller and its unit
	// number there. Zero in a Spec; recorded at the clone.
	Controller int32 `json:"c,omitempty"`
	Unit       int32 `json:"u,omitempty"`
}

// DisksMark is the KeyDisks value for disks ("" for none).
func DisksMark(disks []Disk) string {
	if len(disks) == 0 {
		return ""
	}
	js, _ := json.Marshal(disks)
	return string(js)
}

// ParseDisks reads a KeyDisks value; a value it cannot read is no disk (the VM then differs from a
// spec with disks and is replaced).
func ParseDisks(mark string) []Disk {
	var out []Disk
	if mark == "" || json.Unmarshal([]byte(mark), &out) != nil {
		return nil
	}
	return out
}

// layout is what of the disks a clone fixes: their names and datastores, in order.
func layout(disks []Disk) string {
	var b strings.Builder
	for _, d := range disks {
		b.WriteString(d.Name + "@" + d.Datastore + ";")
	}
	return b.String()
}

// grown returns the member's disks with the spec's sizes where the spec's are larger, and whether
// any is: disks grow in place; a smaller size (refused at admission) is left alone.
func grown(have, want []Disk) ([]Disk, bool) {
	if layout(have) != layout(want) {
		return nil, false
	}
	out := slices.Clone(have)
	changed := false
	for i := range out {
		if want[i].SizeGiB > out[i].SizeGiB {
			out[i].SizeGiB, changed = want[i].SizeGiB, true
		}
	}
	return out, changed
}

// Grown is the member's disks at the spec's sizes when any must grow, else nil.
func (m Member) Grown(s Spec) []Disk {
	out, changed := grown(m.Disks, s.Disks)
	if !changed {
		return nil
	}
	return out
}
