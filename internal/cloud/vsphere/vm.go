package vsphere

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	domain "github.com/quartermaster-dev/quartermaster/internal/vsphere"
)

// API is what the vmgroups controller needs from vCenter; *Client implements it.
type API interface {
	FolderPath(ctx context.Context, p Placement, name string) (string, error)
	Folder(ctx context.Context, path string, create bool) (Folder, error)
	List(ctx context.Context, f Folder) (Listing, error)
	DestroyFolder(ctx context.Context, f Folder) error
	Source(ctx context.Context, p Placement, t Template) (*Source, error)
	Clone(ctx context.Context, src *Source, f Folder, spec CloneSpec) (string, error)
	PowerOn(ctx context.Context, id string) error
	PowerOff(ctx context.Context, id string) error
	ShutdownGuest(ctx context.Context, id string, timeout time.Duration) (bool, error)
	Reconfigure(ctx context.Context, id string, cpu, memoryMB int32, disks []domain.Disk) error
	Destroy(ctx context.Context, id string) error
	Cluster(ctx context.Context, p Placement) (Cluster, error)
	Affinity(ctx context.Context, cl Cluster, rule string) (Affinity, error)
	PutRule(ctx context.Context, cl Cluster, r Rule) error
	RemoveRule(ctx context.Context, cl Cluster, key int32) error
	MAC(ctx context.Context, id string) (string, error)
	SetExtraConfig(ctx context.Context, id string, extra map[string]string) error
	VMsWithIP(ctx context.Context, ip string) ([]string, error)
}

var _ API = (*Client)(nil)

// Template is what a group's members are cloned from: a template (or VM) by inventory path or
// name and, for linked clones, which of its snapshots the clones' disks are children of ("": its
// current snapshot).
type Template struct {
	Path     string
	Linked   bool
	Snapshot string
	// Disks are data disks each clone gets beside the template's (Controller and Unit unset).
	Disks []domain.Disk
}

// Source is a resolved template with the placement of its clones; resolve once per batch.
type Source struct {
	Template string
	template types.ManagedObjectReference
	snapshot *types.ManagedObjectReference // linked clones: the snapshot their disks are children of
	// snapshotName is that snapshot's name, recorded on each linked clone.
	snapshotName string
	pool         types.ManagedObjectReference
	datastore    *types.ManagedObjectReference
	nic          types.BaseVirtualDeviceConfigSpec // re-points the first network adapter; nil keeps the template's
	disks        []sourceDisk                      // data disks each clone gets
}

// sourceDisk is a data disk placed on the template's disk controller, with its datastore resolved.
type sourceDisk struct {
	disk      domain.Disk
	datastore *types.ManagedObjectReference // nil: the VM's
	dsName    string
}

// Disks are the data disks each clone gets, placed (controller and unit) as they will be on it.
func (s *Source) Disks() []domain.Disk {
	var out []domain.Disk
	for _, d := range s.disks {
		out = append(out, d.disk)
	}
	return out
}

// Linked reports whether the source makes linked clones.
func (s *Source) Linked() bool { return s.snapshot != nil }

// Snapshot is the name of the snapshot linked clones are made from ("" for full clones).
func (s *Source) Snapshot() string { return s.snapshotName }

// snapshotName is the name of the snapshot ref in a snapshot tree.
func snapshotName(trees []types.VirtualMachineSnapshotTree, ref types.ManagedObjectReference) string {
	for _, t := range trees {
		if t.Snapshot == ref {
			return t.Name
		}
		if n := snapshotName(t.ChildSnapshotList, ref); n != "" {
			return n
		}
	}
	return ""
}

// finderIn is a finder in the placement's datacenter.
func (c *Client) finderIn(ctx context.Context, p Placement) (*find.Finder, error) {
	finder := find.NewFinder(c.vim)
	dcName, err := c.datacenterName(ctx, p.Datacenter)
	if err != nil {
		return nil, err
	}
	dc, err := finder.Datacenter(ctx, dcName)
	if err != nil {
		return nil, c.redact(lookupError(err, "datacenter", dcName))
	}
	finder.SetDatacenter(dc)
	return finder, nil
}

// resourcePool is the placement's resource pool, or the datacenter's only one.
func (c *Client) resourcePool(ctx context.Context, finder *find.Finder, p Placement) (*object.ResourcePool, error) {
	var pool *object.ResourcePool
	var err error
	if p.ResourcePool != "" {
		pool, err = finder.ResourcePool(ctx, p.ResourcePool)
	} else {
		pool, err = finder.DefaultResourcePool(ctx)
	}
	if err != nil {
		return nil, c.redact(lookupError(err, "resource pool", p.ResourcePool))
	}
	return pool, nil
}

// Source resolves the template (and, for linked clones, its snapshot) and the placement. A missing
// item is a NotFoundError naming it; a template without the snapshot a linked clone needs, an
// InvalidError saying so.
func (c *Client) Source(ctx context.Context, p Placement, t Template) (*Source, error) {
	template := t.Path
	finder, err := c.finderIn(ctx, p)
	if err != nil {
		return nil, err
	}

	tmpl, err := finder.VirtualMachine(ctx, template)
	if err != nil {
		return nil, c.redact(lookupError(err, "template", template))
	}
	src := &Source{Template: template, template: tmpl.Reference()}
	if t.Linked {
		var vm mo.VirtualMachine
		if err := tmpl.Properties(ctx, tmpl.Reference(), []string{"snapshot"}, &vm); err != nil {
			return nil, c.redact(err)
		}
		ref, problem := pickSnapshot(vm.Snapshot, t.Snapshot)
		if problem != "" {
			return nil, &InvalidError{Kind: "template", Name: template, Problem: problem}
		}
		src.snapshot, src.snapshotName = ref, snapshotName(vm.Snapshot.RootSnapshotList, *ref)
	}

	pool, err := c.resourcePool(ctx, finder, p)
	if err != nil {
		return nil, err
	}
	src.pool = pool.Reference()

	if len(t.Disks) > 0 {
		devices, err := tmpl.Device(ctx)
		if err != nil {
			return nil, c.redact(err)
		}
		ctrl, units, problem := placeDisks(devices, len(t.Disks))
		if problem != "" {
			return nil, &InvalidError{Kind: "template", Name: template, Problem: problem}
		}
		for i, d := range t.Disks {
			d.Controller, d.Unit = ctrl, units[i]
			sd := sourceDisk{disk: d}
			if d.Datastore != "" {
				ds, err := finder.Datastore(ctx, d.Datastore)
				if err != nil {
					return nil, c.redact(lookupError(err, "datastore", d.Datastore))
				}
				ref := ds.Reference()
				sd.datastore, sd.dsName = &ref, ds.Name()
			}
			src.disks = append(src.disks, sd)
		}
	}

	if p.Datastore != "" {
		ds, err := finder.Datastore(ctx, p.Datastore)
		if err != nil {
			return nil, c.redact(lookupError(err, "datastore", p.Datastore))
		}
		ref := ds.Reference()
		src.datastore = &ref
	}

	if p.Network != "" {
		net, err := finder.Network(ctx, p.Network)
		if err != nil {
			return nil, c.redact(lookupError(err, "network", p.Network))
		}
		backing, err := net.EthernetCardBackingInfo(ctx)
		if err != nil {
			return nil, c.redact(err)
		}
		devices, err := tmpl.Device(ctx)
		if err != nil {
			return nil, c.redact(err)
		}
		nics := devices.SelectByType((*types.VirtualEthernetCard)(nil))
		if len(nics) == 0 {
			return nil, &InvalidError{Kind: "template", Name: template, Problem: fmt.Sprintf("no network adapter to connect to network %q", p.Network)}
		}
		nics[0].(types.BaseVirtualEthernetCard).GetVirtualEthernetCard().Backing = backing
		src.nic = &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationEdit, Device: nics[0]}
	}
	return src, nil
}

// CloneSpec is one VM to clone.
type CloneSpec struct {
	Name        string
	CPU         int32
	MemoryMB    int32
	ExtraConfig map[string]string // marks (domain.KeyGroup, …) and guestinfo written on the VM
	// PoweredOff leaves the clone off, for the caller to place it under a rule before it runs.
	PoweredOff bool
}

// Clone clones the source into the folder, with the spec's CPU and memory, powered on (unless
// spec.PoweredOff), and waits for it. It returns the new VM's id.
func (c *Client) Clone(ctx context.Context, src *Source, f Folder, spec CloneSpec) (string, error) {
	var extra []types.BaseOptionValue
	for _, k := range slices.Sorted(maps.Keys(spec.ExtraConfig)) {
		extra = append(extra, &types.OptionValue{Key: k, Value: spec.ExtraConfig[k]})
	}
	cs := types.VirtualMachineCloneSpec{
		Location: types.VirtualMachineRelocateSpec{Pool: &src.pool, Datastore: src.datastore},
		PowerOn:  !spec.PoweredOff,
		Config:   &types.VirtualMachineConfigSpec{NumCPUs: spec.CPU, MemoryMB: int64(spec.MemoryMB), ExtraConfig: extra},
	}
	if src.nic != nil {
		cs.Location.DeviceChange = []types.BaseVirtualDeviceConfigSpec{src.nic}
	}
	for i, d := range src.disks {
		unit := d.disk.Unit
		file := ""
		if d.dsName != "" {
			file = "[" + d.dsName + "]"
		}
		disk := &types.VirtualDisk{
			VirtualDevice: types.VirtualDevice{
				Key: int32(-100 - i), ControllerKey: d.disk.Controller, UnitNumber: &unit,
				Backing: &types.VirtualDiskFlatVer2BackingInfo{
					VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: file, Datastore: d.datastore},
					DiskMode:                     string(types.VirtualDiskModePersistent),
					ThinProvisioned:              types.NewBool(true),
				},
			},
			CapacityInKB: int64(d.disk.SizeGiB) << 20,
		}
		cs.Config.DeviceChange = append(cs.Config.DeviceChange, &types.VirtualDeviceConfigSpec{
			Operation: types.VirtualDeviceConfigSpecOperationAdd, FileOperation: types.VirtualDeviceConfigSpecFileOperationCreate, Device: disk,
		})
	}
	if src.snapshot != nil {
		// A linked clone: its disks are new children of the snapshot's, not copies.
		cs.Snapshot = src.snapshot
		cs.Location.DiskMoveType = string(types.VirtualMachineRelocateDiskMoveOptionsCreateNewChildDiskBacking)
	}
	folder := object.NewFolder(c.vim, f.ref())
	task, err := object.NewVirtualMachine(c.vim, src.template).Clone(ctx, folder, spec.Name, cs)
	if err != nil {
		return "", c.redact(err)
	}
	info, err := task.WaitForResult(ctx)
	if err != nil {
		return "", c.redact(fmt.Errorf("cloning %s: %w", spec.Name, err))
	}
	ref, ok := info.Result.(types.ManagedObjectReference)
	if !ok {
		return "", errors.New("clone task returned no VM")
	}
	return ref.Value, nil
}

func (c *Client) vm(id string) *object.VirtualMachine {
	return object.NewVirtualMachine(c.vim, types.ManagedObjectReference{Type: "VirtualMachine", Value: id})
}

// wait runs a task and waits for it.
func (c *Client) wait(ctx context.Context, start func(context.Context) (*object.Task, error)) error {
	task, err := start(ctx)
	if err == nil {
		err = task.Wait(ctx)
	}
	return c.redact(err)
}

// PowerOn powers the VM on; one already on is not an error.
func (c *Client) PowerOn(ctx context.Context, id string) error {
	err := c.wait(ctx, c.vm(id).PowerOn)
	if fault.Is(err, &types.InvalidPowerState{}) {
		return nil
	}
	return err
}

// PowerOff powers the VM off (hard); one already off, or gone, is not an error.
func (c *Client) PowerOff(ctx context.Context, id string) error {
	err := c.wait(ctx, c.vm(id).PowerOff)
	if fault.Is(err, &types.InvalidPowerState{}) || IsGone(err) {
		return nil
	}
	return err
}

// ShutdownGuest asks the guest's VMware Tools to shut the guest down and waits up to timeout for
// the VM to be powered off. It reports whether it was; false with no error when the guest took
// longer, or refused (tools not running after all), so the caller powers it off hard.
func (c *Client) ShutdownGuest(ctx context.Context, id string, timeout time.Duration) (bool, error) {
	vm := c.vm(id)
	if err := vm.ShutdownGuest(ctx); err != nil {
		switch {
		case IsGone(err) || fault.Is(err, &types.InvalidPowerState{}):
			return true, nil // gone or off already
		case fault.Is(err, &types.ToolsUnavailable{}) || fault.Is(err, &types.InvalidState{}):
			return false, nil
		}
		return false, c.redact(err)
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := vm.WaitForPowerState(wctx, types.VirtualMachinePowerStatePoweredOff)
	switch {
	case err == nil || IsGone(err):
		return true, nil
	case wctx.Err() != nil && ctx.Err() == nil:
		return false, nil // timed out: the caller powers off hard
	}
	return false, c.redact(err)
}

// Reconfigure sets the VM's CPU and memory (the VM is powered off by the caller) and, when disks
// is not nil, its data disks' sizes (each found where the disks mark places it; only growing is
// asked for) with the mark recording them.
func (c *Client) Reconfigure(ctx context.Context, id string, cpu, memoryMB int32, disks []domain.Disk) error {
	spec := types.VirtualMachineConfigSpec{NumCPUs: cpu, MemoryMB: int64(memoryMB)}
	if disks != nil {
		devices, err := c.vm(id).Device(ctx)
		if err != nil {
			return c.redact(err)
		}
		for _, d := range disks {
			disk := findDisk(devices, d)
			if disk == nil {
				return fmt.Errorf("data disk %q is not on the VM (controller %d, unit %d)", d.Name, d.Controller, d.Unit)
			}
			if want := int64(d.SizeGiB) << 20; disk.CapacityInKB < want {
				disk.CapacityInKB, disk.CapacityInBytes = want, want<<10
				spec.DeviceChange = append(spec.DeviceChange, &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationEdit, Device: disk})
			}
		}
		spec.ExtraConfig = []types.BaseOptionValue{&types.OptionValue{Key: domain.KeyDisks, Value: domain.DisksMark(disks)}}
	}
	return c.wait(ctx, func(ctx context.Context) (*object.Task, error) { return c.vm(id).Reconfigure(ctx, spec) })
}

// findDisk is the VM's disk at the controller and unit the mark records.
func findDisk(devices object.VirtualDeviceList, d domain.Disk) *types.VirtualDisk {
	for _, dev := range devices.SelectByType((*types.VirtualDisk)(nil)) {
		vd := dev.(*types.VirtualDisk)
		if vd.ControllerKey == d.Controller && vd.UnitNumber != nil && *vd.UnitNumber == d.Unit {
			return vd
		}
	}
	return nil
}

// placeDisks finds where n data disks go on a clone of a template with these devices: the SCSI
// controller of its first disk (else its first SCSI controller), at the lowest free unit numbers
// (7 is the controller's own); else why not, for a person.
func placeDisks(devices object.VirtualDeviceList, n int) (int32, []int32, string) {
	var ctrl types.BaseVirtualDevice
	for _, dev := range devices.SelectByType((*types.VirtualDisk)(nil)) {
		if c := devices.FindByKey(dev.GetVirtualDevice().ControllerKey); c != nil {
			if _, scsi := c.(types.BaseVirtualSCSIController); scsi {
				ctrl = c
				break
			}
		}
	}
	if ctrl == nil {
		scsi := devices.SelectByType((*types.VirtualSCSIController)(nil))
		if len(scsi) == 0 {
			return 0, nil, "has no SCSI controller for data disks (spec.disks)"
		}
		ctrl = scsi[0]
	}
	key := ctrl.GetVirtualDevice().Key
	used := map[int32]bool{7: true}
	for _, dev := range devices {
		if d := dev.GetVirtualDevice(); d.ControllerKey == key && d.UnitNumber != nil {
			used[*d.UnitNumber] = true
		}
	}
	var units []int32
	for u := int32(0); u < 16 && len(units) < n; u++ {
		if !used[u] {
			units = append(units, u)
		}
	}
	if len(units) < n {
		return 0, nil, fmt.Sprintf("has room for %d data disks on its SCSI controller, not the %d spec.disks asks for", len(units), n)
	}
	return key, units, ""
}

// Destroy deletes the VM (powered off by the caller); one already gone is not an error.
func (c *Client) Destroy(ctx context.Context, id string) error {
	err := c.wait(ctx, c.vm(id).Destroy)
	if IsGone(err) {
		return nil
	}
	return err
}

// MAC returns the MAC address of the VM's first network adapter ("" when it has none).
func (c *Client) MAC(ctx context.Context, id string) (string, error) {
	devices, err := c.vm(id).Device(ctx)
	if err != nil {
		return "", c.redact(err)
	}
	for _, d := range devices.SelectByType((*types.VirtualEthernetCard)(nil)) {
		return d.(types.BaseVirtualEthernetCard).GetVirtualEthernetCard().MacAddress, nil
	}
	return "", nil
}

// SetExtraConfig writes extraConfig entries on the VM (guestinfo the guest reads at its first boot,
// while it is powered off).
func (c *Client) SetExtraConfig(ctx context.Context, id string, extra map[string]string) error {
	spec := types.VirtualMachineConfigSpec{}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		spec.ExtraConfig = append(spec.ExtraConfig, &types.OptionValue{Key: k, Value: extra[k]})
	}
	return c.wait(ctx, func(ctx context.Context) (*object.Task, error) { return c.vm(id).Reconfigure(ctx, spec) })
}

// VMsWithIP returns the names of the VMs whose guests report the address (VMware Tools), in any
// datacenter: one search-index call (and one name read per VM found).
func (c *Client) VMsWithIP(ctx context.Context, ip string) ([]string, error) {
	refs, err := object.NewSearchIndex(c.vim).FindAllByIp(ctx, nil, ip, true)
	if err != nil {
		return nil, c.redact(err)
	}
	var names []string
	for _, r := range refs {
		name, err := object.NewCommon(c.vim, r.Reference()).ObjectName(ctx)
		if err != nil {
			name = r.Reference().Value
		}
		names = append(names, name)
	}
	return names, nil
}

// pickSnapshot finds the snapshot linked clones are made from: the one named name, or the current
// one when name is ""; else why there is none, for a person.
func pickSnapshot(info *types.VirtualMachineSnapshotInfo, name string) (*types.ManagedObjectReference, string) {
	const linked = "a linked clone (cloneMode: Linked) is made from a snapshot of its template"
	if info == nil || len(info.RootSnapshotList) == 0 {
		return nil, "has no snapshot: " + linked + "; take one, or clone in full (cloneMode: Full)"
	}
	if name == "" {
		if info.CurrentSnapshot == nil {
			return nil, "has no current snapshot: " + linked + "; name one in spec.snapshot"
		}
		return info.CurrentSnapshot, ""
	}
	var names []string
	var found []types.ManagedObjectReference
	var walk func([]types.VirtualMachineSnapshotTree)
	walk = func(trees []types.VirtualMachineSnapshotTree) {
		for _, tr := range trees {
			names = append(names, strconv.Quote(tr.Name))
			if tr.Name == name {
				found = append(found, tr.Snapshot)
			}
			walk(tr.ChildSnapshotList)
		}
	}
	walk(info.RootSnapshotList)
	switch len(found) {
	case 1:
		return &found[0], ""
	case 0:
		return nil, fmt.Sprintf("has no snapshot named %q (it has %s)", name, strings.Join(names, ", "))
	}
	return nil, fmt.Sprintf("has %d snapshots named %q: rename them so that the one to clone from is unique", len(found), name)
}
